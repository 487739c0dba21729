package job

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// The byte tests of names (validate.go, label.go) against the regular
// expressions they stand for, on every string of up to three characters
// of an alphabet that has each class's edge, and on random longer ones.
func TestNameTestsMatchTheirExpressions(t *testing.T) {
	cases := []struct {
		name string
		re   *regexp.Regexp
		max  int // the test's own length bound, beyond the expression's
		f    func(string) bool
	}{
		{"id", regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`), 128, ValidSubmittedID},
		{"pool", regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`), 0, ValidPool},
		{"env key", regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`), 0, validEnvKey},
		{"file", regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$`), 0, validFileName},
		{"label name", regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`), 0, validLabelName},
	}
	alphabet := []string{"a", "Z", "0", "9", "_", "-", ".", "/", " ", "é", "\x00", "~"}
	var all []string
	var grow func(prefix string, n int)
	grow = func(prefix string, n int) {
		all = append(all, prefix)
		if n == 0 {
			return
		}
		for _, c := range alphabet {
			grow(prefix+c, n-1)
		}
	}
	grow("", 3)
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		var b strings.Builder
		for range r.IntN(140) {
			b.WriteString(alphabet[r.IntN(6)+r.IntN(3)*r.IntN(3)])
		}
		all = append(all, b.String(), strings.Repeat("a", 60+r.IntN(8)), strings.Repeat("a.", 60+r.IntN(8))+"a")
	}
	for _, c := range cases {
		for _, s := range all {
			want := c.re.MatchString(s) && (c.max == 0 || len(s) <= c.max)
			if got := c.f(s); got != want {
				t.Errorf("%s %q: %v; the expression says %v", c.name, s, got, want)
			}
		}
	}
}
