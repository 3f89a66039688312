package checker

import (
	"fmt"
	"strings"
)

// Check 13: tenants. See doc.go.

// FTenantProbe is one call a tenant's credential made on an id that belongs to another
// tenant (or to nobody): Op.Action says which call, Op.Credential whose credential, and
// Op.Error holds the status message of the answer, not the whole error.
const FTenantProbe = "tenant_probe"

// The calls a probe makes (Op.Action): an upsert (Schedule with on_conflict REPLACE) and an
// update carry Op.Payload, which begins with ProbePayloadPrefix.
const (
	ProbeUpsert         = "upsert"
	ProbeUpdate         = "update"
	ProbeCancel         = "cancel"
	ProbeGet            = "get"
	ProbeRecurringGet   = "recurring_get"
	ProbeRecurringPause = "recurring_pause"
)

// ProbePayloadPrefix begins every payload a probe sends and no other op's: a record that
// carries one is a probe's write that reached Kafka.
const ProbePayloadPrefix = "probe-"

// NotPermitted is the one refusal a credential may get for an id outside its scope,
// whether or not the id exists and whatever topic it is on: the same words for both, and
// neither the other tenant's topic nor its credential.
func NotPermitted(id, credential string) string {
	return fmt.Sprintf("id %q: not permitted for credential %q", id, credential)
}

// tenantViolations runs check 13: each finding is one probe that was let through or that
// was refused in other words than NotPermitted, or one record carrying a probe's payload.
func tenantViolations(ops []Op, recs []Record) []idFinding {
	var out []idFinding
	add := func(id, format string, args ...any) {
		out = append(out, idFinding{id: id, finding: finding{check: "tenant_violations", why: fmt.Sprintf(format, args...)}})
	}
	for i := range ops {
		op := &ops[i]
		if op.F != FTenantProbe {
			continue
		}
		switch op.Type {
		case TypeOK:
			add(op.ID, "%s of %q with credential %q (op %d) succeeded", op.Action, op.ID, op.Credential, op.Index)
		case TypeFail:
			if want := NotPermitted(op.ID, op.Credential); op.Code != "PermissionDenied" || op.Error != want {
				add(op.ID, "%s of %q with credential %q (op %d) was refused %s %q, want PermissionDenied %q",
					op.Action, op.ID, op.Credential, op.Index, op.Code, op.Error, want)
			}
		}
	}
	for i := range recs {
		if r := &recs[i]; strings.HasPrefix(r.Payload, ProbePayloadPrefix) {
			add(r.ID, "record %s/%d@%d of %q carries a probe's payload %q", r.Topic, r.Partition, r.Offset, r.ID, r.Payload)
		}
	}
	return out
}
