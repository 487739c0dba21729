package docker

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleet-dev/fleet/job"
)

// fakeSMI writes an nvidia-smi that lists the given GPUs, one "index,
// uuid, name" line each, as --query-gpu=index,uuid,name
// --format=csv,noheader does.
func fakeSMI(t *testing.T, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "nvidia-smi")
	script := "#!/bin/sh\n[ \"$1\" = --query-gpu=index,uuid,name ] || exit 2\ncat <<'EOF'\n" + strings.Join(lines, "\n") + "\nEOF\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestGPUInventoryAndPlacement(t *testing.T) {
	smi := fakeSMI(t, "0, GPU-aaaa, NVIDIA H100 80GB HBM3", "1, GPU-bbbb, NVIDIA H100 80GB HBM3", "2, GPU-cccc, NVIDIA L4")
	b := setup(t, Config{NvidiaSMI: smi, Labels: map[string]string{"disk": "ssd"}, PlacementKeys: []string{"disk"}})
	e := b.exec
	if got := e.models(); !slices.Equal(got, []job.GPUModel{{Model: "NVIDIA-H100-80GB-HBM3", Count: 2}, {Model: "NVIDIA-L4", Count: 1}}) {
		t.Errorf("models %+v", got)
	}
	if e.gpuTotal() != 3 {
		t.Errorf("GPUs %d, want the 3 nvidia-smi lists", e.gpuTotal())
	}
	inv, err := e.Inventory(context.Background())
	if err != nil || len(inv.GPUs) != 2 || !slices.Equal(inv.PlacementKeys, []string{"disk"}) || !slices.ContainsFunc(inv.Images, func(s string) bool { return strings.HasPrefix(s, "fleet-test/testprog:") }) {
		t.Errorf("inventory %+v, %v", inv, err)
	}
	req := func(gpu int, model string, sel map[string]string) *job.Request {
		r := &job.Request{Image: b.image, Resources: &job.Resources{GPU: gpu, GPUModel: model}}
		if sel != nil {
			r.Placement = &job.Placement{NodeSelector: sel}
		}
		r.Normalize()
		return r
	}
	for _, tc := range []struct {
		r          *job.Request
		fits, fail string
	}{
		{req(2, "NVIDIA-H100-80GB-HBM3", nil), "", ""},
		{req(2, "NVIDIA-L4", nil), "2 GPUs of model NVIDIA-L4 requested; this worker's Docker host has 1", ""},
		{req(1, "A100", nil), "has 0 (models: 2×NVIDIA-H100-80GB-HBM3, 1×NVIDIA-L4)", ""},
		{req(0, "", map[string]string{"disk": "ssd"}), "", ""},
		{req(0, "", map[string]string{"disk": "hdd"}), "this worker's labels do not match", ""},
		{req(0, "", map[string]string{"zone": "a"}), "labels do not match", `key "zone" is not one this pool allows`},
		{req(4, "", nil), "", "4 GPUs requested; this worker's Docker host offers 3"},
	} {
		fits, valid := e.Fits(tc.r), e.Validate(tc.r)
		if (tc.fits == "") != (fits == nil) || fits != nil && !strings.Contains(fits.Error(), tc.fits) {
			t.Errorf("Fits(%+v, %v) = %v, want %q", tc.r.Resources, tc.r.Placement, fits, tc.fits)
		}
		if (tc.fail == "") != (valid == nil) || valid != nil && !strings.Contains(valid.Error(), tc.fail) {
			t.Errorf("Validate(%+v, %v) = %v, want %q", tc.r.Resources, tc.r.Placement, valid, tc.fail)
		}
	}

	// Devices of the model asked for, none twice at once.
	first, release, err := e.devices(&job.Resources{GPU: 1, GPUModel: "NVIDIA-H100-80GB-HBM3"})
	if err != nil || len(first) != 1 || len(first[0].DeviceIDs) != 1 {
		t.Fatalf("devices: %+v, %v", first, err)
	}
	second, release2, err := e.devices(&job.Resources{GPU: 1, GPUModel: "NVIDIA-H100-80GB-HBM3"})
	if err != nil || second[0].DeviceIDs[0] == first[0].DeviceIDs[0] {
		t.Fatalf("a second H100: %+v, %v; want the other one", second, err)
	}
	if _, _, err := e.devices(&job.Resources{GPU: 1, GPUModel: "NVIDIA-H100-80GB-HBM3"}); err == nil {
		t.Error("a third H100 of two")
	}
	release()
	release2()
	if again, _, err := e.devices(&job.Resources{GPU: 2, GPUModel: "NVIDIA-H100-80GB-HBM3"}); err != nil || len(again[0].DeviceIDs) != 2 {
		t.Errorf("both H100s once released: %+v, %v", again, err)
	}
}

func TestNoNvidiaSMI(t *testing.T) {
	b := setup(t, Config{NvidiaSMI: "-"})
	if b.exec.gpuTotal() != 0 || len(b.exec.models()) != 0 {
		t.Errorf("GPUs without nvidia-smi: %d, %v", b.exec.gpuTotal(), b.exec.models())
	}
	broken := filepath.Join(t.TempDir(), "nvidia-smi")
	if err := os.WriteFile(broken, []byte("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b = setup(t, Config{NvidiaSMI: broken})
	if b.exec.gpuTotal() != 0 || !strings.Contains(b.logs.String(), "NVIDIA-SMI has failed") {
		t.Errorf("a failing nvidia-smi: %d GPUs, logs %s", b.exec.gpuTotal(), b.logs.String())
	}
}
