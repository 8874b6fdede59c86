package apitypes

import (
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"unicode"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// DecodeError turns an error of encoding/json decoding a request into an
// invalid_argument error that names the field and says what was expected
// in JSON terms (never a Go type). whole names the whole document: "body"
// for REST, "arguments" for MCP tools. Front ends handle their own transport
// errors (a size cap) before calling it.
func DecodeError(whole string, err error) error {
	var (
		syntax *json.SyntaxError
		typ    *json.UnmarshalTypeError
	)
	switch {
	case errors.Is(err, io.EOF):
		return errdefs.Invalidf("%s: empty; want a JSON object", whole)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errdefs.Wrap(errdefs.InvalidArgument, err, "%s: truncated JSON", whole)
	case errors.As(err, &syntax):
		return errdefs.Wrap(errdefs.InvalidArgument, err, "%s: malformed JSON at byte %d: %v", whole, syntax.Offset, syntax)
	case errors.As(err, &typ):
		field := jsonPath(typ.Field)
		if field == "" {
			field = whole
		}
		return errdefs.Wrap(errdefs.InvalidArgument, err, "%s: want %s, got JSON %s", field, JSONTypeName(typ.Type), typ.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// encoding/json has no typed error for unknown fields.
		return errdefs.Wrap(errdefs.InvalidArgument, err, "%s: %s", whole, strings.TrimPrefix(err.Error(), "json: "))
	}
	return errdefs.Wrap(errdefs.InvalidArgument, err, "%s: %v", whole, err)
}

// jsonPath is the JSON path of a field as encoding/json reports it, without
// the Go names of the embedded structs it passed through
// ("ExecRequest.timeout_seconds" is timeout_seconds): the contract's JSON
// names are never capitalised, Go's exported names always are.
func jsonPath(field string) string {
	parts := strings.Split(field, ".")
	out := parts[:0]
	for _, p := range parts {
		if p != "" && !unicode.IsUpper([]rune(p)[0]) {
			out = append(out, p)
		}
	}
	return strings.Join(out, ".")
}

// JSONTypeName names the JSON type that a Go type decodes from.
func JSONTypeName(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice, reflect.Array:
		return "an array of " + strings.TrimPrefix(strings.TrimPrefix(JSONTypeName(t.Elem()), "a "), "an ")
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return JSONTypeName(t.Elem())
	}
	return "a " + t.Kind().String()
}
