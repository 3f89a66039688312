package rpc

import (
	"testing"

	"github.com/chimehq/chime/rpc/auth"
)

// TestSeesEverything: a forecast counts every event, so it is for the
// credentials that see every topic and id, as the authorizer grants them.
func TestSeesEverything(t *testing.T) {
	for _, tc := range []struct {
		g    auth.Grant
		want bool
	}{
		{auth.Grant{Role: auth.RoleAdmin, Topics: []string{"billing"}}, true},
		{auth.Grant{Role: auth.RoleReader}, true},
		{auth.Grant{Role: auth.RoleReader, Topics: []string{"billing-*"}}, false},
		{auth.Grant{Role: auth.RoleScheduler, Topics: []string{"*"}}, true},
		{auth.Grant{Role: auth.RoleScheduler, Topics: []string{"orders", "*"}}, true},
		{auth.Grant{Role: auth.RoleScheduler, Topics: []string{"orders"}}, false},
		{auth.Grant{Role: auth.RoleScheduler}, false},
		{auth.Grant{Role: auth.RoleReader, IDPrefixes: []string{"bill-"}}, false},
		{auth.Grant{Role: auth.RoleScheduler, Topics: []string{"*"}, IDPrefixes: []string{"bill-"}}, false},
	} {
		if got := seesEverything(&tc.g); got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.g, got, tc.want)
		}
	}
}
