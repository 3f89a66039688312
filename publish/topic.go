package publish

import (
	"errors"
	"fmt"
)

// ErrInvalidTopic is wrapped by the error ValidTopic returns for a name
// Kafka would refuse.
var ErrInvalidTopic = errors.New("invalid topic name")

// maxTopicLen is Kafka's limit (org.apache.kafka.common.internals.Topic):
// 249, so that "<topic>-<partition>" directory names stay under 255 bytes.
const maxTopicLen = 249

// ValidTopic reports whether Kafka accepts name as a topic name: 1 to 249
// characters, each of [a-zA-Z0-9._-], and neither "." nor "..". The rpc
// layer calls it so that an event with a topic Kafka would refuse is
// rejected before it is stored rather than dead-lettered when it falls due.
// The error wraps ErrInvalidTopic and names the rule that was broken.
func ValidTopic(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: topic must not be empty", ErrInvalidTopic)
	case len(name) > maxTopicLen:
		return fmt.Errorf("%w: topic is %d characters long, the limit is %d", ErrInvalidTopic, len(name), maxTopicLen)
	case name == "." || name == "..":
		return fmt.Errorf("%w: topic must not be %q", ErrInvalidTopic, name)
	}
	for i := 0; i < len(name); i++ {
		if !topicChar(name[i]) {
			return fmt.Errorf("%w: topic %q has %q at byte %d; allowed are a-z, A-Z, 0-9, '.', '_' and '-'",
				ErrInvalidTopic, name, name[i], i)
		}
	}
	return nil
}

func topicChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == '-'
}
