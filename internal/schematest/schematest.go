// Package schematest compiles the fleet's JSON Schemas (package schemas)
// for tests that hold documents to them.
package schematest

import (
	"bytes"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/fleet-dev/fleet/schemas"
)

// Compiler returns a compiler that holds every schema file, under its $id,
// so that a schema compiles with those it refers to; formats are asserted.
func Compiler(t testing.TB) *jsonschema.Compiler {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	entries, err := schemas.FS.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := schemas.FS.ReadFile(e.Name())
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		if err := c.AddResource(schemas.BaseURL+e.Name(), doc); err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
	}
	return c
}

// Compile compiles the schema ref names: a file of package schemas, with a
// #/$defs/... fragment for one of its definitions.
func Compile(t testing.TB, ref string) *jsonschema.Schema {
	t.Helper()
	s, err := Compiler(t).Compile(schemas.BaseURL + ref)
	if err != nil {
		t.Fatalf("compile %s: %v", ref, err)
	}
	return s
}

// Validate reports why data is not a valid document of s, or nil.
func Validate(s *jsonschema.Schema, data []byte) error {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return err
	}
	return s.Validate(doc)
}
