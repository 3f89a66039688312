package chimev1

// gRPC metadata that nodes send each other when one forwards a client's call
// to the shard's leader through the public API, or calls it for a
// credential. A node honours them only on a call made with a node
// certificate.
//
// This file is written by hand; the generated code lives next to it.
const (
	// ForwardedMetadata marks a call forwarded by another node: the
	// receiving node must not forward it again.
	ForwardedMetadata = "chime-forwarded"
	// CredentialMetadata names the credential (its name in the auth file)
	// whose call was forwarded: the leader checks the operation against
	// that credential's grant, as the node that received the call would.
	CredentialMetadata = "chime-credential"
	// ActingForMetadata names the credential a node acts for as a client
	// of its own cluster (the web console, for its signed-in user): the
	// call is that credential's, limited by its grant, and travels the
	// request path as a client's would, forwarded where it needs to be.
	ActingForMetadata = "chime-acting-for"
)

// LeaderMovedHeader is a response header a node sets when it passed the
// call on to a shard's leader: the caller sent it to a node that does not
// lead, and a client that routes calls to leaders should read the cluster
// map again. Its value is the leader's node id.
const LeaderMovedHeader = "chime-leader-moved"
