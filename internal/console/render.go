package console

import (
	"cmp"
	"embed"
	"fmt"
	"html"
	"html/template"
	"io"
	"io/fs"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

//go:embed web/templates/*.html
var templateFS embed.FS

//go:embed web/static
var staticFS embed.FS

// pages are the parsed templates.
type pages struct{ t *template.Template }

func loadPages() (*pages, error) {
	t, err := template.New("").Funcs(funcs).ParseFS(templateFS, "web/templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("console templates: %w", err)
	}
	return &pages{t: t}, nil
}

func (p *pages) render(w io.Writer, name string, data any) error {
	return p.t.ExecuteTemplate(w, name, data)
}

func static() fs.FS {
	sub, _ := fs.Sub(staticFS, "web/static")
	return sub
}

var funcs = template.FuncMap{
	"age":        age,
	"ago":        func(t time.Time) string { return ago(t, time.Now()) },
	"ts":         stamp,
	"dur":        durText,
	"duration":   jobDuration,
	"bytes":      bytesText,
	"milli":      milliText,
	"pct":        pct,
	"stateOf":    func(s job.State) string { return string(s) },
	"final":      func(s job.State) bool { return s.Final() },
	"join":       strings.Join,
	"labels":     labelText,
	"query":      func(v url.Values) string { return v.Encode() },
	"deref":      func(p *int) int { return *p },
	"timeOf":     func(p *time.Time) time.Time { return derefTime(p) },
	"throughput": throughputChart,
	"latency":    latencyChart,
	"meter":      meter,
	"rangeKeys":  func() []string { return []string{"15m", "1h", "6h", "24h", "7d"} },
	"deref64":    func(p *int64) int64 { return *p },
	"add":        func(a, b int) int { return a + b },
	"percent":    func(f float64) float64 { return 100 * f },
	"runningPath": func(r job.RunningAttempt, pool string) string {
		return jobPath(queue.JobKey{Tenant: cmp.Or(r.Tenant, job.DefaultTenant), Pool: pool, ID: r.JobID})
	},
	"sortedKeys": func(m map[string]string) []string {
		k := make([]string, 0, len(m))
		for key := range m {
			k = append(k, key)
		}
		sort.Strings(k)
		return k
	},
}

func derefTime(p *time.Time) time.Time {
	if p == nil {
		return time.Time{}
	}
	return *p
}

// age is how long ago t was, short: 4s, 12m, 3h, 2d.
func age(t time.Time) string { return ago(t, time.Now()) }

func ago(t, now time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return short(now.Sub(t))
}

func short(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
		fallthrough
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func durText(d time.Duration) string {
	if d == 0 {
		return "—"
	}
	return short(d)
}

// jobDuration is how long a job has run: until it finished, or until now.
func jobDuration(started, finished time.Time) string {
	switch {
	case started.IsZero():
		return "—"
	case finished.IsZero():
		return short(time.Since(started))
	}
	return short(finished.Sub(started))
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

func bytesText(n int64) string { return job.FormatSize(n, " ") }

func milliText(m int64) string {
	if m%1000 == 0 {
		return fmt.Sprint(m / 1000)
	}
	return fmt.Sprintf("%.2f", float64(m)/1000)
}

func pct(used, total int64) int {
	if total <= 0 {
		return 0
	}
	return int(100 * used / total)
}

func labelText(m map[string]string) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, " ")
}

// meter draws a small usage bar (a CSP forbids inline styles, so the
// width is an SVG attribute).
func meter(used, total any) template.HTML {
	u, t := toFloat(used), toFloat(total)
	w := 0.0
	if t > 0 {
		w = min(100, 100*u/t)
	}
	class := "ok"
	switch {
	case w >= 95:
		class = "hot"
	case w >= 75:
		class = "warm"
	}
	return template.HTML(fmt.Sprintf(`<svg class="meter" viewBox="0 0 100 6" preserveAspectRatio="none" aria-hidden="true">`+
		`<rect class="track" width="100" height="6" rx="2"/><rect class="fill %s" width="%.1f" height="6" rx="2"/></svg>`, class, w))
}

// Charts are drawn here as SVG: no chart library, no script.
const (
	chartW, chartH = 600, 120
	padL, padB     = 44, 18
)

func axes(b *strings.Builder, maxV float64, unit string, minutes []MinuteStats) {
	plotH := chartH - padB - 6
	for _, f := range []float64{0, 0.5, 1} {
		y := 6 + float64(plotH)*(1-f)
		fmt.Fprintf(b, `<line class="grid" x1="%d" x2="%d" y1="%.1f" y2="%.1f"/>`, padL, chartW, y, y)
		fmt.Fprintf(b, `<text class="tick" x="%d" y="%.1f" text-anchor="end">%s</text>`, padL-6, y+4, html.EscapeString(axisLabel(maxV*f, unit)))
	}
	if len(minutes) > 0 {
		for _, i := range []int{0, 30, 59} {
			x := padL + (chartW-padL)*i/59
			anchor := "middle"
			if i == 0 {
				anchor = "start"
			} else if i == 59 {
				anchor = "end"
			}
			fmt.Fprintf(b, `<text class="tick" x="%d" y="%d" text-anchor="%s">%s</text>`, x, chartH-2, anchor,
				minutes[i].At.UTC().Format("15:04"))
		}
	}
}

func axisLabel(v float64, unit string) string {
	if v == 0 {
		return "0"
	}
	if unit == "ms" {
		return short(time.Duration(v * float64(time.Millisecond)))
	}
	if v >= 1000 {
		return fmt.Sprintf("%.1fk", v/1000)
	}
	if v == float64(int(v)) {
		return fmt.Sprint(int(v))
	}
	return fmt.Sprintf("%.1f", v)
}

// throughputChart draws jobs finished per minute over the last hour:
// succeeded and the others stacked.
func throughputChart(minutes []MinuteStats) template.HTML {
	var b strings.Builder
	maxV := 1.0
	for _, m := range minutes {
		maxV = max(maxV, float64(m.Finished))
	}
	maxV = niceCeil(maxV)
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" role="img" aria-label="jobs finished per minute">`, chartW, chartH)
	axes(&b, maxV, "", minutes)
	plotH := float64(chartH - padB - 6)
	bw := float64(chartW-padL) / 60
	for i, m := range minutes {
		x := float64(padL) + bw*float64(i)
		ok := plotH * float64(m.Succeeded) / maxV
		bad := plotH * float64(m.Finished-m.Succeeded) / maxV
		y := 6 + plotH
		if ok > 0 {
			fmt.Fprintf(&b, `<rect class="bar ok" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %d succeeded</title></rect>`,
				x+1, y-ok, bw-2, ok, m.At.UTC().Format("15:04"), m.Succeeded)
		}
		if bad > 0 {
			fmt.Fprintf(&b, `<rect class="bar bad" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %d did not succeed</title></rect>`,
				x+1, y-ok-bad, bw-2, bad, m.At.UTC().Format("15:04"), m.Finished-m.Succeeded)
		}
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// latencyChart draws submit → start per minute: p50 and p95 lines.
func latencyChart(minutes []MinuteStats) template.HTML {
	var b strings.Builder
	maxV := 1.0
	for _, m := range minutes {
		maxV = max(maxV, float64(m.P95.Milliseconds()))
	}
	maxV = niceCeil(maxV)
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" role="img" aria-label="submit to start latency per minute">`, chartW, chartH)
	axes(&b, maxV, "ms", minutes)
	plotH := float64(chartH - padB - 6)
	step := float64(chartW-padL) / 59
	line := func(class string, get func(MinuteStats) time.Duration) {
		var pts []string
		for i, m := range minutes {
			if m.Started == 0 {
				continue
			}
			x := float64(padL) + step*float64(i)
			y := 6 + plotH*(1-float64(get(m).Milliseconds())/maxV)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
			fmt.Fprintf(&b, `<circle class="dot %s" cx="%.1f" cy="%.1f" r="2"><title>%s %s: ≤ %s</title></circle>`, class, x, y,
				m.At.UTC().Format("15:04"), class, short(get(m)))
		}
		if len(pts) > 1 {
			fmt.Fprintf(&b, `<polyline class="line %s" points="%s"/>`, class, strings.Join(pts, " "))
		}
	}
	line("p95", func(m MinuteStats) time.Duration { return m.P95 })
	line("p50", func(m MinuteStats) time.Duration { return m.P50 })
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// niceCeil rounds up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := 1.0
	for p*10 <= v {
		p *= 10
	}
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func toFloat(v any) float64 {
	switch n := v.(type) {
	case int:
		return float64(n)
	case int64:
		return float64(n)
	case float64:
		return n
	}
	return 0
}
