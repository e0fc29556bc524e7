package format

import (
	"embed"
	"fmt"
)

//go:embed schemas
var schemaFiles embed.FS

// ContractSchema returns the schema of the ledger's contract in format f
// (avro, protobuf, json-schema): the five fields under their own names,
// which the default mapping reads; and the file it is kept in
// (internal/event/format/schemas/), for a producer to register.
func ContractSchema(f string) (text, file string, err error) {
	switch f {
	case Avro:
		file = "billing-event.avsc"
	case Protobuf:
		file = "billing-event.proto"
	case JSONSchema:
		file = "billing-event.schema.json"
	default:
		return "", "", fmt.Errorf("format: %q has no schema file", f)
	}
	b, err := schemaFiles.ReadFile("schemas/" + file)
	return string(b), file, err
}
