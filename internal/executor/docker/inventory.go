package docker

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"

	"github.com/fleet-dev/fleet/job"
)

// What a Docker host offers for placement: its GPUs, by model, as
// nvidia-smi lists them; the images it has; the worker's labels, which
// stand for the host's in placement.node_selector.

// gpu is one GPU of the host.
type gpu struct {
	index string
	uuid  string
	// model is the GPU's name as the node label nvidia.com/gpu.product
	// writes it: nvidia-smi's name with spaces as dashes
	// ("NVIDIA H100 80GB HBM3" is "NVIDIA-H100-80GB-HBM3").
	model string
}

// modelLabel writes a GPU name as NVIDIA's GPU feature discovery does in
// the node label nvidia.com/gpu.product.
func modelLabel(name string) string {
	return strings.Join(strings.Fields(name), "-")
}

// readGPUs lists the host's GPUs with nvidia-smi, or none when there is no
// nvidia-smi (path "" looks it up in the PATH; "-" turns it off).
func readGPUs(ctx context.Context, path string) ([]gpu, error) {
	if path == "-" {
		return nil, nil
	}
	if path == "" {
		p, err := exec.LookPath("nvidia-smi")
		if err != nil {
			return nil, nil // no NVIDIA driver on this host
		}
		path = p
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--query-gpu=index,uuid,name", "--format=csv,noheader").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return nil, fmt.Errorf("nvidia-smi: %w", err)
	}
	var gpus []gpu
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ",")
		if len(f) != 3 {
			continue
		}
		g := gpu{index: strings.TrimSpace(f[0]), uuid: strings.TrimSpace(f[1]), model: modelLabel(f[2])}
		if g.uuid != "" && g.model != "" {
			gpus = append(gpus, g)
		}
	}
	return gpus, nil
}

// gpuList returns the host's GPUs, read once.
func (e *Executor) gpuList() []gpu {
	e.gpuOnce.Do(func() {
		gpus, err := readGPUs(context.Background(), e.cfg.NvidiaSMI)
		if err != nil {
			e.log.Warn("cannot list the host's GPUs; GPU models are unknown", "err", err)
		}
		e.gpus = gpus
	})
	return e.gpus
}

// gpuTotal is how many GPUs requests may ask for: the configuration's, or
// the host's as nvidia-smi lists them.
func (e *Executor) gpuTotal() int {
	if e.cfg.GPUs > 0 {
		return e.cfg.GPUs
	}
	return len(e.gpuList())
}

// models counts the host's GPUs by model.
func (e *Executor) models() []job.GPUModel {
	var out []job.GPUModel
	for _, g := range e.gpuList() {
		i := slices.IndexFunc(out, func(m job.GPUModel) bool { return m.Model == g.model })
		if i < 0 {
			out = append(out, job.GPUModel{Model: g.model})
			i = len(out) - 1
		}
		out[i].Count++
	}
	if len(out) > job.MaxInventoryGPUs {
		out = out[:job.MaxInventoryGPUs]
	}
	return out
}

// Fits implements executor.Fitter: a request for GPUs of a model this host
// has too few of, or for labels this worker does not carry, is for another
// worker of the pool.
func (e *Executor) Fits(r *job.Request) error {
	if r.Placement != nil {
		for _, k := range slices.Sorted(maps.Keys(r.Placement.NodeSelector)) {
			if k == job.GPUModelLabel {
				continue // resources.gpu_model's business, below
			}
			if v, ok := e.cfg.Labels[k]; !ok || v != r.Placement.NodeSelector[k] {
				return fmt.Errorf("node_selector %s=%s: this worker's labels do not match", k, r.Placement.NodeSelector[k])
			}
		}
	}
	model := gpuModel(r)
	if model == "" || r.Resources == nil || r.Resources.GPU == 0 {
		return nil
	}
	have := 0
	for _, g := range e.gpuList() {
		if g.model == model {
			have++
		}
	}
	if have < r.Resources.GPU {
		return fmt.Errorf("%d GPUs of model %s requested; this worker's Docker host has %d (models: %s)",
			r.Resources.GPU, model, have, modelNames(e.models()))
	}
	return nil
}

// gpuModel is the GPU model a request asks for, by resources.gpu_model or
// its node selector.
func gpuModel(r *job.Request) string {
	if r.Resources != nil && r.Resources.GPUModel != "" {
		return r.Resources.GPUModel
	}
	if r.Placement != nil {
		return r.Placement.NodeSelector[job.GPUModelLabel]
	}
	return ""
}

func modelNames(models []job.GPUModel) string {
	if len(models) == 0 {
		return "none"
	}
	var names []string
	for _, m := range models {
		names = append(names, fmt.Sprintf("%d×%s", m.Count, m.Model))
	}
	return strings.Join(names, ", ")
}

// devices chooses the GPUs of an attempt that asks for a model: that many
// of the host's GPUs of that model that no other attempt of this executor
// holds. Without a model, the NVIDIA runtime picks any (a count). release
// gives the chosen ones back.
func (e *Executor) devices(r *job.Resources) (reqs []container.DeviceRequest, release func(), err error) {
	release = func() {}
	if r == nil || r.GPU == 0 {
		return nil, release, nil
	}
	model := r.GPUModel
	if model == "" {
		return []container.DeviceRequest{{Driver: "nvidia", Count: r.GPU, Capabilities: [][]string{{"gpu"}}}}, release, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var ids []string
	for _, g := range e.gpuList() {
		if g.model == model && !e.gpuBusy[g.uuid] && len(ids) < r.GPU {
			ids = append(ids, g.uuid)
		}
	}
	if len(ids) < r.GPU {
		return nil, release, fmt.Errorf("%d GPUs of model %s requested; %d of this host's are free", r.GPU, model, len(ids))
	}
	for _, id := range ids {
		e.gpuBusy[id] = true
	}
	release = func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, id := range ids {
			delete(e.gpuBusy, id)
		}
	}
	return []container.DeviceRequest{{Driver: "nvidia", DeviceIDs: ids, Capabilities: [][]string{{"gpu"}}}}, release, nil
}

// Inventory implements executor.InventoryReader: the host's GPU models, the
// images it has (at most job.MaxInventoryImages, newest first), and the
// label keys requests may select.
func (e *Executor) Inventory(ctx context.Context) (*job.Inventory, error) {
	inv := &job.Inventory{GPUs: e.models(), PlacementKeys: e.cfg.PlacementKeys}
	imgs, err := e.api.ImageList(ctx, image.ListOptions{})
	if err != nil {
		return inv, fmt.Errorf("list images: %w", err)
	}
	slices.SortFunc(imgs, func(a, b image.Summary) int { return int(b.Created - a.Created) })
	for _, img := range imgs {
		for _, tag := range img.RepoTags {
			if tag != "" && tag != "<none>:<none>" && len(inv.Images) < job.MaxInventoryImages {
				inv.Images = append(inv.Images, tag)
			}
		}
	}
	return inv, nil
}

// Cached implements executor.ImageCache: whether the host has the image.
func (e *Executor) Cached(ctx context.Context, image string) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := e.api.ImageInspect(ctx, image)
	return err == nil
}
