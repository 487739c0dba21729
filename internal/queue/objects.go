package queue

import "github.com/nats-io/nats.go/jetstream"

// The object store buckets. Outputs and logs go to the artifacts bucket,
// which workers write and producers read; inputs by reference to the
// uploads bucket, which producers write and workers read. Two buckets, so
// that the NATS roles can keep producers from rewriting what workers
// stored, and workers from rewriting what producers uploaded.

// ArtifactsBucket holds the outputs stored as objects and the attempts'
// logs (stream OBJ_<prefix>-artifacts).
func (n Names) ArtifactsBucket() string { return n.prefix() + "-artifacts" }

// UploadsBucket holds the inputs producers upload for their requests
// (stream OBJ_<prefix>-uploads).
func (n Names) UploadsBucket() string { return n.prefix() + "-uploads" }

// ObjectStores returns the configurations of the object store buckets:
// replicated as the streams are, and kept for the job retention, so that
// a job's artifacts go about when its record does.
func (c Config) ObjectStores() []jetstream.ObjectStoreConfig {
	c = c.WithDefaults()
	return []jetstream.ObjectStoreConfig{
		{Bucket: c.ArtifactsBucket(), Description: "Outputs stored as objects, and every attempt's log",
			TTL: c.Retention, Storage: c.storage(), Replicas: c.Replicas},
		{Bucket: c.UploadsBucket(), Description: "Inputs uploaded by producers, named by requests' input_refs",
			TTL: c.Retention, Storage: c.storage(), Replicas: c.Replicas},
	}
}
