package console

// The pools page: each pool's state (paused or running, its sharing
// policy) and how its tenants fare, queued by priority, running, their
// share of the slots beside the share their weight gives them, and their
// decayed usage; read through the dispatcher (Config.Pools) at most once a
// second whatever the number of open pages.

import (
	"context"
	"net/http"
	"time"

	"github.com/fleet-dev/fleet/job"
)

type poolsData struct {
	Off   bool // the console was given no way to read the pools
	Pools []*job.PoolState
	Read  time.Time
	Err   string
}

func (c *Console) poolsPage(ctx context.Context, _ *http.Request, v *view) error {
	d := &poolsData{Off: c.cfg.Pools == nil}
	pools, read, _, err := c.pools.get(ctx)
	d.Pools, d.Read = pools, read
	if err != nil {
		d.Err = err.Error()
	}
	v.Data = d
	return nil
}
