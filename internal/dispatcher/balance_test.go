package dispatcher

import "testing"

func TestUnbalanced(t *testing.T) {
	all := []string{"n0", "n1", "n2"}
	led := func(stream, leader string, servers ...string) leadership {
		if servers == nil {
			servers = all
		}
		return leadership{stream: stream, leader: leader, servers: servers}
	}
	for _, tc := range []struct {
		name       string
		group      []leadership
		stream, to string
	}{
		{"empty", nil, "", ""},
		{"one per server", []leadership{led("a", "n0"), led("b", "n1"), led("c", "n2")}, "", ""},
		{"two and one differ by one", []leadership{led("a", "n0"), led("b", "n0"), led("c", "n1"), led("d", "n2")}, "", ""},
		{"a server leading none", []leadership{led("a", "n0"), led("b", "n0"), led("c", "n1")}, "a", "n2"},
		{"all on one server", []leadership{led("a", "n0"), led("b", "n0"), led("c", "n0")}, "a", "n1"},
		{"the only replica that is current", []leadership{
			led("a", "n0", "n0", "n2"), led("b", "n0", "n0", "n2"), led("c", "n0", "n0", "n1", "n2"),
		}, "c", "n1"},
		{"no current replica on the idle server", []leadership{
			led("a", "n0", "n0", "n2"), led("b", "n0", "n0", "n2"), led("c", "n2", "n0", "n2"), led("d", "n1", "n1"),
		}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream, to, ok := unbalanced(tc.group)
			if ok != (tc.stream != "") || stream != tc.stream || to != tc.to {
				t.Errorf("unbalanced = %q → %q (%v), want %q → %q", stream, to, ok, tc.stream, tc.to)
			}
		})
	}
}
