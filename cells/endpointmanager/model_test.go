package endpointmanager

import (
	"encoding/json"
	"reflect"
	"testing"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
)

// fill sets every field reachable from v to a non-zero value, so that a
// field missing from the conversion (or from models) shows in the JSON.
func fill(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), n)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			fill(v.Field(i), n)
		}
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := 0; i < 2; i++ {
			fill(v.Index(i), n)
		}
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, n)
		fill(e, n)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.String:
		v.SetString("s" + string(rune('a'+*n%26)))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n % 100))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n % 100))
	default:
		panic("fill: unhandled kind " + v.Kind().String())
	}
}

func TestStatusModel(t *testing.T) {
	var full ciliumv2.EndpointStatus
	n := 0
	fill(reflect.ValueOf(&full).Elem(), &n)
	// A nil element in each list of pointers, as an API object may have.
	full.Log = append(full.Log, nil)
	full.NamedPorts = append(full.NamedPorts, nil)
	full.Networking.Addressing = append(full.Networking.Addressing, nil)

	for name, st := range map[string]ciliumv2.EndpointStatus{
		"every field set": full,
		"empty":           {},
		"empty lists":     {Networking: &ciliumv2.EndpointNetworking{Addressing: ciliumv2.AddressPairList{}}, Log: []*ciliumv2.EndpointStatusChange{}},
	} {
		want, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		got, err := json.Marshal(statusModel(st))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s: models JSON differs from the CEP status JSON\n got: %s\nwant: %s", name, got, want)
		}
	}
}
