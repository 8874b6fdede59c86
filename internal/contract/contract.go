// Package contract walks the JSON contract that pkg/apitypes declares: the
// fields of a type as encoding/json names them (embedded structs flattened,
// "-" left out, the shallower of two same-named fields winning), and example
// values with every field set. The front ends' contract tests use it to
// check that what they serve carries every field of the contract, and
// cmd/tsgen to write the web editor's TypeScript types; both read the types
// the same way encoding/json does, so neither can drift from the wire.
package contract

import (
	"reflect"
	"strings"
	"time"
)

// Field is one JSON member of a struct type.
type Field struct {
	Name      string       // the JSON name
	Type      reflect.Type // the Go type of the value
	OmitEmpty bool         // absent when zero
	GoName    string       // the Go field name, for messages
}

// Fields lists the JSON members of struct type t (a pointer is followed) in
// declaration order, embedded structs flattened as encoding/json does.
func Fields(t reflect.Type) []Field {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	type entry struct {
		f     Field
		depth int
	}
	var order []string
	byName := map[string]entry{}
	var walk func(t reflect.Type, depth int)
	walk = func(t reflect.Type, depth int) {
		for i := range t.NumField() {
			sf := t.Field(i)
			tag := sf.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			ft := sf.Type
			if sf.Anonymous && name == "" {
				et := ft
				if et.Kind() == reflect.Pointer {
					et = et.Elem()
				}
				if et.Kind() == reflect.Struct {
					walk(et, depth+1)
					continue
				}
			}
			if !sf.IsExported() {
				continue
			}
			if name == "" {
				name = sf.Name
			}
			f := Field{Name: name, Type: ft, OmitEmpty: strings.Contains(","+opts+",", ",omitempty,"), GoName: sf.Name}
			if old, ok := byName[name]; ok {
				if old.depth <= depth {
					continue // the shallower field wins
				}
			} else {
				order = append(order, name)
			}
			byName[name] = entry{f, depth}
		}
	}
	walk(t, 0)
	out := make([]Field, 0, len(order))
	for _, n := range order {
		out = append(out, byName[n].f)
	}
	return out
}

// Example returns a value of type t with every field set to something
// that is not its zero value (one element in each slice and map), so that
// its JSON shows every member, omitempty ones too.
func Example(t reflect.Type) reflect.Value {
	return example(t, 0)
}

// maxDepth stops recursive types (a result holding results).
const maxDepth = 6

var timeType = reflect.TypeFor[time.Time]()

func example(t reflect.Type, depth int) reflect.Value {
	v := reflect.New(t).Elem()
	if depth > maxDepth {
		return v
	}
	switch {
	case t == timeType:
		v.Set(reflect.ValueOf(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
		return v
	}
	switch t.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Pointer:
		v.Set(example(t.Elem(), depth+1).Addr())
	case reflect.Slice:
		s := reflect.MakeSlice(t, 1, 1)
		s.Index(0).Set(example(t.Elem(), depth+1))
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(t)
		m.SetMapIndex(example(t.Key(), depth+1), example(t.Elem(), depth+1))
		v.Set(m)
	case reflect.Struct:
		for i := range t.NumField() {
			if t.Field(i).IsExported() {
				v.Field(i).Set(example(t.Field(i).Type, depth+1))
			}
		}
	case reflect.Interface:
		if t.NumMethod() == 0 {
			v.Set(reflect.ValueOf("x"))
		}
	}
	return v
}

// ExampleOf is Example for a type parameter.
func ExampleOf[T any]() T {
	return Example(reflect.TypeFor[T]()).Interface().(T)
}

// Missing lists the members of contract type want (recursively, as
// dotted paths: "termination.cause") that the decoded JSON object got
// lacks. got is what the front end served, decoded into a map; lists are
// checked through their first element.
func Missing(want reflect.Type, got any) []string {
	var out []string
	missing(want, got, "", &out, 0)
	return out
}

func missing(t reflect.Type, got any, prefix string, out *[]string, depth int) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
		if t.Kind() != reflect.Pointer {
			l, ok := got.([]any)
			if !ok || len(l) == 0 {
				return // an empty list: nothing to look into
			}
			got = l[0]
		}
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == timeType || depth > maxDepth {
		return
	}
	obj, ok := got.(map[string]any)
	if !ok {
		return
	}
	for _, f := range Fields(t) {
		v, ok := obj[f.Name]
		if !ok {
			*out = append(*out, prefix+f.Name)
			continue
		}
		missing(f.Type, v, prefix+f.Name+".", out, depth+1)
	}
}
