package checker

import "testing"

// probe is a tenant_probe op of tenant-a on id, answered code and message (ok when code is
// "", info for Unavailable).
func probe(action, id, code, msg string) Op {
	op := Op{F: FTenantProbe, Action: action, ID: id, Credential: "tenant-a", Type: TypeFail, Code: code, Error: msg}
	switch code {
	case "":
		op.Type = TypeOK
	case "Unavailable":
		op.Type = TypeInfo
	}
	return op
}

func TestTenantProbesRefusedAlikePass(t *testing.T) {
	g := genClean(1, 200)
	g.ops = append(g.ops,
		probe(ProbeUpsert, "e1", "PermissionDenied", `id "e1": not permitted for credential "tenant-a"`),
		probe(ProbeRecurringPause, "r1", "PermissionDenied", `id "r1": not permitted for credential "tenant-a"`),
		probe(ProbeGet, "e1000000007", "PermissionDenied", `id "e1000000007": not permitted for credential "tenant-a"`),
		probe(ProbeCancel, "e2", "Unavailable", "connection refused"), // no answer: nothing judged
	)
	res := g.check()
	assertClean(t, res)
	if got := res.Ops[FTenantProbe]; got[TypeFail] != 3 || got[TypeInfo] != 1 {
		t.Fatalf("tenant_probe ops = %v, want 3 refused and 1 unanswered", got)
	}
}

// TestTenantViolationsPlanted: each kind of violation check 13 exists for, planted alone in
// a clean run, makes it invalid with one tenant_violations finding about the id.
func TestTenantViolationsPlanted(t *testing.T) {
	for name, op := range map[string]Op{
		"let through":                 probe(ProbeUpdate, "e3", "", ""),
		"a read let through":          probe(ProbeRecurringGet, "r2", "", ""),
		"existence told by NOT_FOUND": probe(ProbeCancel, "e1000000009", "NotFound", `event "e1000000009" not found`),
		"existence told by the code":  probe(ProbeUpsert, "e4", "AlreadyExists", `id "e4": not permitted for credential "tenant-a"`),
		"the other topic named":       probe(ProbeGet, "e5", "PermissionDenied", `event "e5" is on topic "jepsen.b"`),
		"another credential named":    probe(ProbeGet, "e6", "PermissionDenied", `id "e6": not permitted for credential "workload"`),
	} {
		t.Run(name, func(t *testing.T) {
			g := genClean(1, 200)
			g.ops = append(g.ops, op)
			assertOnly(t, g.check(), "tenant_violations", op.ID)
		})
	}
	t.Run("a probe's write produced", func(t *testing.T) {
		g := genClean(1, 200)
		r := g.recs[0]
		r.Payload, r.Offset = ProbePayloadPrefix+"12", r.Offset+1_000_000
		g.recs = append(g.recs, r)
		res := g.check()
		if res.Valid || res.TenantViolations != 1 || res.Examples["tenant_violations"][0].ID != r.ID {
			t.Fatalf("valid %v, tenant_violations %d (%v), want invalid with one about %s", res.Valid, res.TenantViolations, res.Examples["tenant_violations"], r.ID)
		}
	})
}
