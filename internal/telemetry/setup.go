package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	promexp "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
)

// Config configures Setup.
type Config struct {
	// Service is the service name of the process ("fleet-dispatcher").
	Service string
	Version string
	// SpanExporter, when set, receives every span (tests use an in-memory
	// one). Otherwise spans go to OTLP when OTEL_EXPORTER_OTLP_ENDPOINT or
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, and nowhere if not.
	SpanExporter sdktrace.SpanExporter
}

// Telemetry is what Setup installed.
type Telemetry struct {
	// Metrics serves the Prometheus exposition of the process's metrics.
	Metrics  http.Handler
	shutdown []func(context.Context) error
}

// Setup installs the global meter provider, with a Prometheus exporter,
// and the global tracer provider when spans have somewhere to go.
func Setup(ctx context.Context, c Config) (*Telemetry, error) {
	res, err := resource.Merge(resource.Default(), resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName(c.Service), semconv.ServiceVersion(c.Version)))
	if err != nil {
		res = resource.Default()
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := promexp.New(promexp.WithRegisterer(reg), promexp.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res))
	otel.SetMeterProvider(mp)
	t := &Telemetry{Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), shutdown: []func(context.Context) error{mp.Shutdown}}

	se := c.SpanExporter
	if se == nil {
		if se, err = otlpExporter(ctx); err != nil {
			return nil, err
		}
	}
	if se != nil {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(se), sdktrace.WithResource(res))
		otel.SetTracerProvider(tp)
		t.shutdown = append(t.shutdown, tp.Shutdown)
	}
	otel.SetTextMapPropagator(Propagator)
	return t, nil
}

// Shutdown flushes and stops the providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}

// ForceFlush exports the spans ended so far.
func (t *Telemetry) ForceFlush(ctx context.Context) error {
	if tp, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); ok {
		return tp.ForceFlush(ctx)
	}
	return nil
}
