package telemetry

import (
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// otlpExporter returns an OTLP span exporter when the standard variables
// name an endpoint, or nil. OTEL_EXPORTER_OTLP_PROTOCOL (or its _TRACES_
// form) chooses grpc or http/protobuf (the default); every other OTEL_*
// setting (headers, TLS, timeout) is read by the exporter itself.
func otlpExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return nil, nil
	}
	if os.Getenv("OTEL_TRACES_EXPORTER") == "none" {
		return nil, nil
	}
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch proto {
	case "grpc":
		return otlptracegrpc.New(ctx)
	case "", "http/protobuf":
		return otlptracehttp.New(ctx)
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: use grpc or http/protobuf", proto)
	}
}
