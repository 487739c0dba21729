package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
)

// Persist asks for a data directory that every attempt of the job sees,
// retries and adoption included: $FLEET_DATA (/fleet/data in a container).
// In a request it is written as true, or as an object with a size:
//
//	"persist": true
//	"persist": {"size": "10Gi"}
//
// false, or no field, asks for none. The directory goes when the job ends
// for good.
type Persist struct {
	// Enabled is false when the request says "persist": false; Normalize
	// then drops the field.
	Enabled bool `json:"-"`
	// Size is the volume's size, as a quantity, where the backend enforces
	// one; empty leaves it to the backend.
	Size string `json:"size,omitempty"`
}

// UnmarshalJSON accepts true, false, or an object with a size.
func (p *Persist) UnmarshalJSON(data []byte) error {
	switch t := bytes.TrimSpace(data); {
	case bytes.Equal(t, []byte("true")):
		*p = Persist{Enabled: true}
		return nil
	case bytes.Equal(t, []byte("false")):
		*p = Persist{}
		return nil
	}
	type plain Persist
	var v plain
	if err := decodeStrict(data, &v); err != nil {
		return errors.New("persist must be true, false or an object with a size")
	}
	*p = Persist(v)
	p.Enabled = true
	return nil
}

// MarshalJSON writes true, false, or the object when a size is set.
func (p Persist) MarshalJSON() ([]byte, error) {
	switch {
	case !p.Enabled:
		return []byte("false"), nil
	case p.Size == "":
		return []byte("true"), nil
	}
	type plain Persist
	return json.Marshal(plain(p))
}

// Persists reports whether the request asks for a data directory.
func (r *Request) Persists() bool { return r.Persist != nil && r.Persist.Enabled }

// Placement says where the job may run, among what its pool allows.
type Placement struct {
	// NodeSelector lists labels the node (Kubernetes) or the worker
	// (Docker, process: its --labels) must carry. Keys must be among those
	// the pool's workers allow (their --placement-keys).
	NodeSelector map[string]string `json:"node_selector,omitempty"`
}

// Clone returns a deep copy of p.
func (p *Placement) Clone() *Placement {
	if p == nil {
		return nil
	}
	return &Placement{NodeSelector: maps.Clone(p.NodeSelector)}
}

// GPUModelLabel is the node label that names a node's GPU model
// (NVIDIA's GPU feature discovery sets it); resources.gpu_model selects it.
const GPUModelLabel = "nvidia.com/gpu.product"

// MaxNodeSelector bounds the entries of placement.node_selector.
const MaxNodeSelector = 16
