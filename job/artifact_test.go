package job_test

import (
	"strings"
	"testing"

	"github.com/fleet-dev/fleet/job"
)

func TestCheckObjectKey(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want string // part of the error; empty when the key is valid
	}{
		{"a", ""},
		{"uploads/01JD5/data set.bin", ""},
		{"ünïcode/ключ", ""},
		{"a.b/.hidden/..x", ""},
		{strings.Repeat("k", job.MaxObjectKey), ""},
		{"", "empty"},
		{strings.Repeat("k", job.MaxObjectKey+1), "over the limit of 512"},
		{"/etc/passwd", "absolute"},
		{"a/../b", `".." segment`},
		{"..", `".." segment`},
		{"a/./b", `"." segment`},
		{"a//b", "empty segment"},
		{"a/", "empty segment"},
		{"a\nb", "control character"},
		{"a\x7fb", "control character"},
		{"a\u0085b", "control character"},
		{"a\xffb", "not UTF-8"},
	} {
		err := job.CheckObjectKey(tc.key)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.key, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want an error saying %q", tc.key, err, tc.want)
		}
	}
}

func TestInputRefsAreCheckedAndCloned(t *testing.T) {
	size := int64(5)
	sum := strings.Repeat("ab", 32)
	r := &job.Request{Command: []string{"true"}, Inputs: map[string]string{"a.txt": "x"},
		InputRefs: map[string]job.InputRef{"b.bin": {Key: "k/b.bin", SHA256: sum, Size: &size}}}
	if err := r.Validate(job.Limits{}); err != nil {
		t.Fatal(err)
	}
	c := r.Clone()
	*c.InputRefs["b.bin"].Size = 7
	if *r.InputRefs["b.bin"].Size != 5 {
		t.Error("a clone shares its input refs' sizes with the original")
	}
	// Inline and by reference count together against MaxInputs; sizes
	// given count against MaxInputRefBytes.
	err := r.Validate(job.Limits{MaxInputs: 1, MaxInputRefBytes: 4})
	if err == nil || !strings.Contains(err.Error(), "2 files together, over the limit of 1") ||
		!strings.Contains(err.Error(), "5 bytes together, over the limit of 4") {
		t.Errorf("limits: %v", err)
	}
}
