package natstest

import (
	"fmt"
	"net"
	"strings"
	"testing"
)

// A server that cannot start says why, first: its exit status and the
// errors it logged come before the rest of its log, and only its own
// lines, not those of the process it replaced.
func TestAServerThatExitsWhileStartingSaysWhy(t *testing.T) {
	c := RunServer(t)
	c.Kill(0)
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", c.nodes[0].client))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c.start(c.nodes[0], ServerBinary(t))
	err = c.waitListening(0)
	if err == nil {
		t.Fatal("the server started on a port another listener holds")
	}
	msg := err.Error()
	errs, _, _ := strings.Cut(msg, "the last lines it logged:")
	if !strings.Contains(errs, "exit status") || !strings.Contains(errs, "address already in use") {
		t.Fatalf("the report does not say why, first:\n%s", msg)
	}
	if n := strings.Count(msg, "Starting nats-server"); n != 1 {
		t.Fatalf("the report holds %d starts' lines, want the last one's:\n%s", n, msg)
	}
	l.Close()
	c.Restart(0)
}
