package rpc

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

// idEncoding renders generated ids: lower-case RFC 4648 base32 without
// padding, so 16 bytes become 26 characters of [a-z2-7], safe in URLs, file
// names and Kafka header values, and easy to read aloud.
var idEncoding = base32.NewEncoding(strings.ToLower("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")).WithPadding(base32.NoPadding)

// newID returns a fresh event id: 128 bits from crypto/rand, so two servers
// never pick the same one in practice (the chance of any collision among 2^40
// generated ids is about 2^-49). crypto/rand.Read never fails on supported
// platforms: Go crashes the program instead of returning weak randomness.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return idEncoding.EncodeToString(b[:])
}
