package membership

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrNoEncryption is returned by SetKeys on a member started without keys:
// gossip encryption is chosen at start (see doc.go, Gossip encryption).
var ErrNoEncryption = errors.New("membership: gossip encryption is off on this node (it started without keys); turning it on takes a restart")

// keyRule is the rule for one key: memberlist encrypts with AES-GCM and
// picks AES-128, -192 or -256 by the key's length.
const keyRule = "a key is 16, 24 or 32 (AES-128, AES-192, AES-256)"

func validKeyLen(key []byte) bool { return len(key) == 16 || len(key) == 24 || len(key) == 32 }

// checkKeys checks a key list as Config.Keys and SetKeys take it: at least
// one key, each of a valid length, none twice.
func checkKeys(field string, keys [][]byte) error {
	if len(keys) == 0 {
		return fmt.Errorf("membership: %s is empty: give at least the primary key", field)
	}
	for i, k := range keys {
		if !validKeyLen(k) {
			return fmt.Errorf("membership: %s[%d] is %d bytes: %s", field, i, len(k), keyRule)
		}
		if j := slices.IndexFunc(keys[:i], func(o []byte) bool { return bytes.Equal(o, k) }); j >= 0 {
			return fmt.Errorf("membership: %s[%d] is the same key as %s[%d]", field, i, field, j)
		}
	}
	return nil
}

// ParseKeyFile decodes a gossip key file: one base64 (standard encoding,
// padded) key per line, the first the primary, which encrypts everything
// this node sends; the others are only tried to decrypt what it receives.
// Blank lines and lines starting with # are ignored, and so is the space
// around a key. This is the format of `consul keygen` and of
// `head -c 32 /dev/urandom | base64`. Errors name the line and the rule; the
// caller names the file.
func ParseKeyFile(data []byte) ([][]byte, error) {
	var keys [][]byte
	var lines []int // the line number of each key
	for i, raw := range bytes.Split(data, []byte("\n")) {
		n := i + 1
		line := strings.TrimSpace(string(raw))
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, err := base64.StdEncoding.DecodeString(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: not a base64 key (one key per line, # starts a comment): %w", n, err)
		}
		if !validKeyLen(key) {
			return nil, fmt.Errorf("line %d: %d bytes after base64 decoding, %s", n, len(key), keyRule)
		}
		if j := slices.IndexFunc(keys, func(o []byte) bool { return bytes.Equal(o, key) }); j >= 0 {
			return nil, fmt.Errorf("line %d: the same key as line %d", n, lines[j])
		}
		keys, lines = append(keys, key), append(lines, n)
	}
	if len(keys) == 0 {
		return nil, errors.New("no key in it: the first key line is the primary key (make one with: head -c 32 /dev/urandom | base64)")
	}
	return keys, nil
}

// KeyID names a key in logs and status without revealing it: the first 8
// hex digits of its SHA-256.
func KeyID(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:4])
}

// keyIDs names each key, in order.
func keyIDs(keys [][]byte) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = KeyID(k)
	}
	return out
}

// Keys returns the gossip keys in use, the primary first; nil when gossip is
// not encrypted.
func (m *Membership) Keys() [][]byte {
	if m.keyring == nil {
		return nil
	}
	m.keysMu.Lock()
	defer m.keysMu.Unlock()
	var out [][]byte
	for _, k := range m.keyring.GetKeys() {
		out = append(out, bytes.Clone(k))
	}
	return out
}

// SetKeys makes keys the gossip keys of this member, at once and without a
// restart: keys[0] becomes the primary, which encrypts everything this
// member sends, and the others are kept only to decrypt what it receives.
// Setting the keys in use does nothing.
//
// The member never stops reading what it could read: the new keys are
// installed first, then the primary switches, and only then are the keys no
// longer listed removed. Across the cluster, a rotation is three changes,
// each applied on every member before the next (doc.go, Gossip encryption):
// add the new key as a secondary, make it the primary, remove the old one.
//
// SetKeys on a member started without keys returns ErrNoEncryption.
func (m *Membership) SetKeys(keys [][]byte) error {
	if m.keyring == nil {
		return ErrNoEncryption
	}
	if err := checkKeys("keys", keys); err != nil {
		return err
	}
	m.keysMu.Lock()
	defer m.keysMu.Unlock()
	before := slices.Clone(m.keyring.GetKeys())
	for _, k := range keys {
		// AddKey keeps the primary and ignores a key already installed.
		if err := m.keyring.AddKey(bytes.Clone(k)); err != nil {
			return fmt.Errorf("membership: installing key %s: %w", KeyID(k), err) // checked above; never
		}
	}
	if err := m.keyring.UseKey(keys[0]); err != nil {
		return fmt.Errorf("membership: making key %s the primary: %w", KeyID(keys[0]), err) // installed above; never
	}
	// Last first: memberlist's RemoveKey shifts the keys after the removed
	// one in place, in the array a receiver may be reading without a lock
	// (doc.go, memberlist quirks); removing the last key shifts nothing.
	for _, old := range slices.Backward(before) {
		if !slices.ContainsFunc(keys, func(k []byte) bool { return bytes.Equal(k, old) }) {
			if err := m.keyring.RemoveKey(old); err != nil {
				return fmt.Errorf("membership: removing key %s: %w", KeyID(old), err) // not the primary; never
			}
		}
	}
	after := m.keyring.GetKeys()
	if !slices.EqualFunc(before, after, bytes.Equal) {
		m.log.Info("gossip keys changed", "primary", KeyID(after[0]), "keys", keyIDs(after), "before", keyIDs(before))
	}
	return nil
}
