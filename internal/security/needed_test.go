package security_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// traced is one publish or subscription the server traced: who did it,
// and on what subject (a subscription with its queue group, as an allow
// line names it).
type traced struct {
	nkey, op, subject string
}

var traceRE = regexp.MustCompile(`"[^"]*/nkey:(U[A-Z0-9]+)" - <<- \[(H?PUB|SUB) ([^ \]]+)(?: ([^ \]]+))?`)

func (l *serverLog) traced() []traced {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []traced
	for _, line := range l.ops {
		m := traceRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		t := traced{nkey: m[1], op: strings.TrimPrefix(m[2], "H"), subject: m[3]}
		if t.op == "SUB" {
			// SUB subject [queue] sid: a queue group comes before the sid.
			if q := subQueue(line); q != "" {
				t.subject += " " + q
			}
		}
		out = append(out, t)
	}
	return out
}

// subQueue is the queue group of a traced SUB line, if any.
func subQueue(line string) string {
	_, rest, _ := strings.Cut(line, "<<- [SUB ")
	f := strings.Fields(strings.TrimSuffix(strings.TrimSpace(rest), "]"))
	if len(f) == 3 {
		return f[1]
	}
	return ""
}

// matches reports whether an allow line's subject (wildcards and all)
// matches a subject a client used. A client's subject may hold a literal
// "*" token (a direct get of fleet.p.<pool>.*.<tenant>.<id>): the allow
// line's token must then be a wildcard too, as the server's check is.
func matches(pattern, subject string) bool {
	pq, sq := "", ""
	pattern, pq, _ = strings.Cut(pattern, " ")
	subject, sq, _ = strings.Cut(subject, " ")
	if pq != sq {
		return false
	}
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok == "*" || tok == s[i]:
		default:
			return false
		}
	}
	return len(p) == len(s)
}

// onlyOnACluster are allow lines that the paths of TestEachRoleDoesItsWork
// (one server, no Redis, no lost deliveries) do not need, and why they are
// there.
var onlyOnACluster = map[string]string{
	"dispatcher pub $JS.API.STREAM.LIST":                            "the leader balancer lists the streams (replicas > 1)",
	"dispatcher pub $JS.API.STREAM.LEADER.STEPDOWN.*":               "the leader balancer moves leaders (replicas > 1)",
	"dispatcher pub $JS.API.CONSUMER.LIST.*":                        "the lag gauges list the pools' consumers",
	"dispatcher pub $JS.API.CONSUMER.NAMES.*":                       "the placer lists a stream's consumers (replicas > 1)",
	"dispatcher pub $JS.API.CONSUMER.LEADER.STEPDOWN.*.*":           "the placer moves a consumer to its stream's leader (replicas > 1)",
	"dispatcher sub $JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.*.*": "the placer hears a consumer elect a leader (replicas > 1)",
	"worker-default pub $JS.API.CONSUMER.CREATE.FLEET_POOL_default.*.fleet.p.default.*.*.>": "a queue deleted by hand is made again, " +
		"one made by a dispatcher is given the worker's ack wait",
	"dispatcher pub fleet.t.*.ev.>":                               "the reaper's heartbeat events for a lost worker's jobs (with Redis)",
	"worker-default pub $JS.API.STREAM.CREATE.FLEET_POOL_default": "a worker that starts before any dispatcher made its pool's stream",
	"worker-default pub $JS.API.DIRECT.GET.FLEET_POOL_default":    "the record read again on a redelivery, or when a write conflicts (a cancel racing a settle)",
}

// allowsAreNeeded checks, for the dispatcher, the producers' template
// (tenant default's block, as add-tenant.sh copies it) and the workers'
// (pool default's), that every allow line let through something the fleet
// did that no other line of the same user allows: with that line gone,
// that operation would have been refused. A line of a template counts as
// needed when any user made from it needed it. The operator's lines are
// what fleetctl and the nats CLI need to look (exercised by the outside
// client's test), not checked here.
func allowsAreNeeded(t *testing.T, f *fleet) {
	t.Helper()
	opts, err := server.ProcessConfigFile(f.srv.conf)
	if err != nil {
		t.Fatal(err)
	}
	roleOf := map[string]string{}
	for role := range f.keys {
		roleOf[os.Getenv(envName(role))] = role
	}
	used := map[string][]traced{}
	for _, tr := range f.srv.log.traced() {
		used[tr.nkey] = append(used[tr.nkey], tr)
	}
	// template names a line by its template's: the user's tenant or pool
	// written as default's.
	template := func(role, line string) string {
		for _, prefix := range []string{"producer-", "worker-"} {
			if name, ok := strings.CutPrefix(role, prefix); ok {
				return prefix + "default " + regexp.MustCompile(`(^|[._\- ])`+regexp.QuoteMeta(name)+`($|[.\- ])`).
					ReplaceAllString(line, "${1}default${2}")
			}
		}
		return role + " " + line
	}
	needed := map[string]bool{}
	for _, u := range opts.Nkeys {
		role := roleOf[u.Nkey]
		if role == "" || role == roleOperator || u.Permissions == nil {
			continue
		}
		for _, kind := range []struct {
			op    string
			perms *server.SubjectPermission
		}{{"PUB", u.Permissions.Publish}, {"SUB", u.Permissions.Subscribe}} {
			if kind.perms == nil {
				continue
			}
			for _, line := range kind.perms.Allow {
				name := template(role, strings.ToLower(kind.op)+" "+line)
				needed[name] = needed[name] || neededBy(line, kind.op, kind.perms.Allow, used[u.Nkey])
			}
		}
	}
	for name, ok := range needed {
		role, line, _ := strings.Cut(name, " ")
		if why := onlyOnACluster[role+" "+line]; !ok && why == "" {
			t.Errorf("%s: nothing the fleet did needed %s", role, line)
		}
	}
}

// neededBy reports whether a traced operation matches line and no other of
// allow.
func neededBy(line, op string, allow []string, used []traced) bool {
	for _, tr := range used {
		if tr.op != op || !matches(line, tr.subject) {
			continue
		}
		alone := true
		for _, other := range allow {
			if other != line && matches(other, tr.subject) {
				alone = false
				break
			}
		}
		if alone {
			return true
		}
	}
	return false
}
