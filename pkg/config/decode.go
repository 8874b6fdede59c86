package config

import (
	"encoding"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// envPrefix starts every environment override: SANDBOXD_<SECTION>_<KEY>.
const envPrefix = "SANDBOXD"

// decoder overlays a YAML node tree, then environment variables, onto a
// Config by walking its yaml tags with reflection. yaml.v3's own decoder
// (with KnownFields) stops at the first problem and reports a line, not a
// key; walking the nodes ourselves lets every problem name its full key path
// and be collected rather than returned.
//
// A value that fails to decode leaves the field as it was, so the rest of the
// configuration is still decoded and checked.
type decoder struct {
	file   string            // file name used in locations; empty for Parse
	probs  problems          // what went wrong, in order
	origin map[string]string // key path -> where the value that set it came from
}

var (
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	byteSizeType        = reflect.TypeFor[ByteSize]()
	durationType        = reflect.TypeFor[Duration]()
)

// document parses data as YAML and overlays it onto v (a Config). Syntax
// errors are returned; every other problem is collected in d.probs.
func (d *decoder) document(data []byte, v reflect.Value) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return err
	}
	if len(doc.Content) == 0 { // an empty file, or only comments: all defaults
		return nil
	}
	d.value(doc.Content[0], v, "")
	return nil
}

// at formats the location of n for FieldError.Source.
func (d *decoder) at(n *yaml.Node) string {
	if d.file == "" {
		return fmt.Sprintf("line %d", n.Line)
	}
	return fmt.Sprintf("%s:%d", d.file, n.Line)
}

func (d *decoder) fail(key string, n *yaml.Node, format string, args ...any) {
	d.probs.add(key, d.at(n), format, args...)
}

// value overlays node n onto v, whose key path is key.
func (d *decoder) value(n *yaml.Node, v reflect.Value, key string) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		d.null(n, v, key)
		return
	}
	switch {
	case isText(v) || isScalar(v.Kind()):
		if n.Kind != yaml.ScalarNode {
			d.fail(key, n, "expected %s, got %s", describe(v.Type()), describeNode(n))
			return
		}
		if err := setScalar(v, n.Value); err != nil {
			d.fail(key, n, "%v", err)
			return
		}
	case v.Kind() == reflect.Struct:
		if d.expect(n, yaml.MappingNode, v, key) {
			d.structure(n, v, key)
		}
		// A section has no origin of its own: a problem with one of its
		// keys that was not written must not point at the section's line.
		return
	case v.Kind() == reflect.Slice:
		if !d.expect(n, yaml.SequenceNode, v, key) {
			return
		}
		d.list(n, v, key)
	case v.Kind() == reflect.Map:
		if !d.expect(n, yaml.MappingNode, v, key) {
			return
		}
		d.mapping(n, v, key)
	default:
		panic(fmt.Sprintf("config: %s has type %s, which the decoder does not support", key, v.Type()))
	}
	d.origin[key] = d.at(n)
}

// expect reports whether n is of kind k, and records a problem if not.
func (d *decoder) expect(n *yaml.Node, k yaml.Kind, v reflect.Value, key string) bool {
	if n.Kind == k {
		return true
	}
	d.fail(key, n, "expected %s, got %s", describe(v.Type()), describeNode(n))
	return false
}

// null handles an explicit null ("key:" with nothing after it). For a section
// it means "nothing to change", which is what a section whose keys are all
// commented out looks like; for strings, lists and maps it means empty.
// Numbers, sizes and durations have no natural empty value, so it is an error
// there rather than a silent zero.
func (d *decoder) null(n *yaml.Node, v reflect.Value, key string) {
	switch v.Kind() {
	case reflect.Struct:
	case reflect.String, reflect.Slice, reflect.Map:
		v.Set(reflect.Zero(v.Type()))
		d.origin[key] = d.at(n)
	default:
		d.fail(key, n, "expected %s, got nothing", describe(v.Type()))
	}
}

// structure overlays mapping n onto struct v field by field; keys absent
// from n keep their current values.
func (d *decoder) structure(n *yaml.Node, v reflect.Value, key string) {
	index, names := fields(v.Type())
	seen := make(map[string]int) // key -> line, to report duplicates
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.fail(key, k, "keys must be plain names, got %s", describeNode(k))
			continue
		}
		sub := join(key, k.Value)
		if line, dup := seen[k.Value]; dup {
			d.fail(sub, k, "duplicate key (first set on line %d)", line)
			continue
		}
		seen[k.Value] = k.Line
		f, ok := index[k.Value]
		if !ok {
			d.fail(sub, k, "unknown key%s", didYouMean(k.Value, names))
			continue
		}
		d.value(val, v.Field(f), sub)
	}
}

// list replaces slice v with sequence n. If any element is invalid v keeps
// its previous value: half a deny list is worse than the default one.
func (d *decoder) list(n *yaml.Node, v reflect.Value, key string) {
	if len(n.Content) == 0 {
		v.Set(reflect.Zero(v.Type()))
		return
	}
	before := len(d.probs)
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, e := range n.Content {
		d.value(e, s.Index(i), fmt.Sprintf("%s[%d]", key, i))
	}
	if len(d.probs) == before {
		v.Set(s)
	}
}

// mapping replaces map v with mapping n (it does not merge into the
// default: the map written is the map used). Like list, all or nothing.
func (d *decoder) mapping(n *yaml.Node, v reflect.Value, key string) {
	if len(n.Content) == 0 {
		v.Set(reflect.Zero(v.Type()))
		return
	}
	before := len(d.probs)
	m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
	seen := make(map[string]int)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.fail(key, k, "keys must be plain names, got %s", describeNode(k))
			continue
		}
		sub := join(key, k.Value)
		if line, dup := seen[k.Value]; dup {
			d.fail(sub, k, "duplicate key (first set on line %d)", line)
			continue
		}
		seen[k.Value] = k.Line
		e := reflect.New(v.Type().Elem()).Elem()
		d.value(val, e, sub)
		m.SetMapIndex(reflect.ValueOf(k.Value).Convert(v.Type().Key()), e)
	}
	if len(d.probs) == before {
		v.Set(m)
	}
}

// environment overlays the variables envName_<KEY> found through lookup onto
// struct v, recursing into sections: SANDBOXD_SANDBOX_MEMORY sets
// sandbox.memory. Only known names are looked up, so unrelated SANDBOXD_*
// variables (SANDBOXD_SOCKET for sandboxctl, SANDBOXD_INTEGRATION for tests)
// are not mistaken for typos.
func (d *decoder) environment(v reflect.Value, key, envName string, lookup func(string) (string, bool)) {
	if v.Kind() == reflect.Struct && !isText(v) {
		index, names := fields(v.Type())
		for _, name := range names {
			d.environment(v.Field(index[name]), join(key, name), envName+"_"+strings.ToUpper(name), lookup)
		}
		return
	}
	s, ok := lookup(envName)
	if !ok {
		return
	}
	d.origin[key] = envName
	fail := func(key, format string, args ...any) { d.probs.add(key, envName, format, args...) }
	switch {
	case isText(v) || isScalar(v.Kind()):
		if err := setScalar(v, s); err != nil {
			fail(key, "%v", err)
		}
	case v.Kind() == reflect.Slice: // a,b,c
		items := splitList(s)
		out := reflect.MakeSlice(v.Type(), len(items), len(items))
		ok := true
		for i, item := range items {
			if err := setScalar(out.Index(i), item); err != nil {
				fail(fmt.Sprintf("%s[%d]", key, i), "%v", err)
				ok = false
			}
		}
		if ok {
			if len(items) == 0 {
				out = reflect.Zero(v.Type()) // nil, as for an empty YAML list
			}
			v.Set(out)
		}
	case v.Kind() == reflect.Map: // k=v,k=v
		out := reflect.MakeMap(v.Type())
		ok := true
		for _, item := range splitList(s) {
			k, val, found := strings.Cut(item, "=")
			k = strings.TrimSpace(k)
			if !found || k == "" {
				fail(key, "expected key=value pairs separated by commas, got %q", item)
				ok = false
				continue
			}
			e := reflect.New(v.Type().Elem()).Elem()
			if err := setScalar(e, strings.TrimSpace(val)); err != nil {
				fail(join(key, k), "%v", err)
				ok = false
				continue
			}
			out.SetMapIndex(reflect.ValueOf(k).Convert(v.Type().Key()), e)
		}
		if ok {
			if out.Len() == 0 {
				out = reflect.Zero(v.Type()) // nil, as for an empty YAML mapping
			}
			v.Set(out)
		}
	default:
		panic(fmt.Sprintf("config: %s has type %s, which the environment overlay does not support", key, v.Type()))
	}
}

// splitList splits a comma-separated environment value, trimming spaces and
// dropping empty items so that "" is the empty list and "a, b," is [a b].
func splitList(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// setScalar parses s into v, a scalar or a TextUnmarshaler. v is unchanged
// on error, and the error says what was expected without naming the key.
func setScalar(v reflect.Value, s string) error {
	if isText(v) {
		return v.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(s))
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Int, reflect.Int64:
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, v.Type().Bits())
		if errors.Is(err, strconv.ErrRange) {
			return fmt.Errorf("integer %q out of range", s)
		}
		if err != nil {
			return fmt.Errorf("expected an integer, got %q", s)
		}
		v.SetInt(n)
	case reflect.Bool:
		switch strings.TrimSpace(s) {
		case "true":
			v.SetBool(true)
		case "false":
			v.SetBool(false)
		default:
			return fmt.Errorf("expected true or false, got %q", s)
		}
	case reflect.Float64:
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Errorf("expected a number, got %q", s)
		}
		v.SetFloat(f)
	default:
		panic(fmt.Sprintf("config: setScalar on unsupported type %s", v.Type()))
	}
	return nil
}

// isScalar reports whether setScalar handles values of kind k directly.
func isScalar(k reflect.Kind) bool {
	return k == reflect.String || k == reflect.Int || k == reflect.Int64 || k == reflect.Float64 || k == reflect.Bool
}

// isText reports whether v decodes itself from text (ByteSize, Duration).
func isText(v reflect.Value) bool {
	return v.CanAddr() && v.Addr().Type().Implements(textUnmarshalerType)
}

// fields returns the yaml names of struct type t's fields, mapped to their
// indexes and listed in declaration order.
func fields(t reflect.Type) (map[string]int, []string) {
	index := make(map[string]int, t.NumField())
	names := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		index[name] = i
		names = append(names, name)
	}
	return index, names
}

// describe names what a value of type t looks like, for "expected X" messages.
func describe(t reflect.Type) string {
	switch t {
	case byteSizeType:
		return "a size (e.g. 512M)"
	case durationType:
		return "a duration (e.g. 30s)"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int64:
		return "an integer"
	case reflect.Float64:
		return "a number"
	case reflect.Slice:
		return "a list"
	default: // maps and sections
		return "a mapping of keys to values"
	}
}

// describeNode names what n is, for "got X" messages.
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	default:
		return strconv.Quote(n.Value)
	}
}

// join appends name to the key path parent.
func join(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

// parentKey strips the last element of a key path: "network.deny[2]" ->
// "network.deny" -> "network" -> "".
func parentKey(key string) string {
	if strings.HasSuffix(key, "]") {
		if i := strings.LastIndexByte(key, '['); i >= 0 {
			return key[:i]
		}
	}
	if i := strings.LastIndexByte(key, '.'); i >= 0 {
		return key[:i]
	}
	return ""
}
