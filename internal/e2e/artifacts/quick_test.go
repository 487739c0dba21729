package artifacts_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/executor/process"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

func TestQuick(t *testing.T) {
	f := fleettest.Start(t)
	e, err := process.New(process.Config{Dir: t.TempDir(), Grace: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f.Worker(t, e, worker.Config{Slots: 2, Artifacts: f.Artifacts(t)})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ref, err := f.Client.Upload(ctx, "in/data.bin", bytes.NewReader(bytes.Repeat([]byte{1, 2, 3}, 1<<20)))
	if err != nil {
		t.Fatal(err)
	}
	id := f.Submit(t, &job.Request{
		Command:   []string{"sh", "-c", `head -c 3000000 /dev/urandom > $FLEET_OUTPUTS/out.bin; cp $FLEET_INPUTS/data.bin $FLEET_OUTPUTS/copy.bin; echo small > $FLEET_OUTPUTS/s.txt; seq 1 10000; echo err >&2`},
		Outputs:   []string{"out.bin", "s.txt", "copy.bin"},
		InputRefs: map[string]job.InputRef{"data.bin": *ref},
	})
	r := f.Await(t, id, time.Minute)
	t.Logf("result %+v", r)
	if r.Status != job.StatusSucceeded {
		t.Fatal(r.Failure)
	}
	o, err := f.Client.Output(ctx, id, "out.bin")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, o)
	if err != nil || n != 3000000 || hex.EncodeToString(h.Sum(nil)) != r.Artifacts["out.bin"].SHA256 {
		t.Fatalf("%d %v", n, err)
	}
	lr, err := f.Client.Logs(ctx, id, client.LogOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(lr)
	i := 0
	for sc.Scan() {
		l, err := client.ParseLogLine(sc.Text())
		if err != nil {
			t.Fatal(err)
		}
		i++
		if i <= 10000 && l.Line != fmt.Sprint(i) {
			t.Fatalf("line %d: %+v", i, l)
		}
	}
	if i != 10001 {
		t.Fatalf("%d lines", i)
	}
}
