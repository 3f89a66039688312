package doccheck

import (
	"slices"
	"strings"
	"testing"
)

// TestModuleDocs: every name the module's doc.go files give in Go form is
// declared. A failure names the doc.go, its line and the name: rename the
// name in the prose (or, if the prose is about another system, see the
// rules in doc.go of this package).
func TestModuleDocs(t *testing.T) {
	problems, err := Check("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s", p)
	}
}

// TestStaleNames runs the checker on testdata/stale, a module whose doc.go
// files name declarations that exist and others that do not: it must report
// exactly the missing ones, once each, and nothing of the English, the
// other systems' names, the file names and the code block around them.
func TestStaleNames(t *testing.T) {
	problems, err := Check("testdata/stale")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range problems {
		got = append(got, p.File+": "+p.Name)
		if p.Line == 0 || p.Why == "" {
			t.Errorf("%s: no line or no reason", p)
		}
	}
	want := []string{
		"doc.go: Engine.Stop",
		"doc.go: Engine.Run", // a doc link, [Engine.Run]
		"doc.go: horizonLoopV1",
		"doc.go: Tuning.Horizon",
		"doc.go: defaultTuning.Horizon",
		"doc.go: Engine.tuning.Horizon",
		"doc.go: lease.extend",
		"doc.go: Flush()",
		"doc.go: drain", // backquoted
		"doc.go: Close", // a doc link, [Close]
		"doc.go: other.Gone",
		"doc.go: Tuning_Value",
		"doc.go: OtherThing",
		"other/doc.go: Vanished()",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n\t%s\nwant:\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
		for _, p := range problems {
			t.Log(p)
		}
	}
}
