package v2alpha1

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	v2 "github.com/cellium/cellium/api/cilium.io/v2"
)

// testdata/ciliumendpointslice.json is written by hand from Cilium's keys
// (cilium-facts.md section 5.1).

func fullSlice() *CiliumEndpointSlice {
	return &CiliumEndpointSlice{
		TypeMeta:   metav1.TypeMeta{APIVersion: "cilium.io/v2alpha1", Kind: "CiliumEndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{Name: "ces-b4xq9kz7m-2nvrt"},
		Namespace:  "shop",
		Endpoints: []CoreCiliumEndpoint{
			{
				Name:       "web-7d4b9c-x2k4p",
				IdentityID: 40321,
				PodUID:     "6f1d2a9e-8c3b-4e1a-b7a2-2e9f4c7d1a30",
				Networking: &v2.EndpointNetworking{
					Addressing: v2.AddressPairList{{IPV4: "10.0.1.23", IPV6: "fd00::1:17"}},
					NodeIP:     "192.168.10.2",
				},
				Encryption:     v2.EncryptionSpec{Key: 3},
				NamedPorts:     v2.NamedPorts{{Name: "http", Port: 8080, Protocol: "TCP"}},
				ServiceAccount: "web",
			},
			{
				Name:       "web-7d4b9c-q8w2z",
				IdentityID: 40321,
				Networking: &v2.EndpointNetworking{
					Addressing: v2.AddressPairList{{IPV4: "10.0.2.9"}},
					NodeIP:     "192.168.10.3",
				},
			},
		},
	}
}

func requireSameJSON(t *testing.T, got, want []byte) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("decode got: %v\n%s", err, got)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatalf("decode want: %v\n%s", err, want)
	}
	if !reflect.DeepEqual(g, w) {
		gi, _ := json.MarshalIndent(g, "", "  ")
		wi, _ := json.MarshalIndent(w, "", "  ")
		t.Fatalf("JSON differs\n--- got\n%s\n--- want\n%s", gi, wi)
	}
}

func TestGoldenEndpointSlice(t *testing.T) {
	golden, err := os.ReadFile("testdata/ciliumendpointslice.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(fullSlice())
	if err != nil {
		t.Fatal(err)
	}
	requireSameJSON(t, got, golden)

	dec := json.NewDecoder(bytes.NewReader(golden))
	dec.DisallowUnknownFields()
	var decoded CiliumEndpointSlice
	if err := dec.Decode(&decoded); err != nil {
		t.Fatalf("golden has keys the type does not know: %v", err)
	}
	if !reflect.DeepEqual(&decoded, fullSlice()) {
		t.Fatalf("decoded value differs from the fixture: %+v", decoded)
	}
}

func TestEncodeEmptyFields(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value any
		want  string
	}{
		{"slice always carries endpoints", &CiliumEndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "ces-x"}},
			`{"metadata":{"name":"ces-x"},"endpoints":null}`},
		{"core endpoint always carries encryption", CoreCiliumEndpoint{}, `{"encryption":{}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := json.Marshal(tc.value)
			if err != nil {
				t.Fatal(err)
			}
			requireSameJSON(t, got, []byte(tc.want))
		})
	}
}

func TestSchemeAndDeepCopy(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	golden, err := os.ReadFile("testdata/ciliumendpointslice.json")
	if err != nil {
		t.Fatal(err)
	}
	obj, gvk, err := serializer.NewCodecFactory(scheme).UniversalDeserializer().Decode(golden, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if gvk.GroupVersion() != SchemeGroupVersion || !reflect.DeepEqual(obj, fullSlice()) {
		t.Fatalf("scheme decoded %s as %#v", gvk, obj)
	}
	if _, _, err := scheme.ObjectKinds(&CiliumEndpointSliceList{}); err != nil {
		t.Fatal(err)
	}

	orig := fullSlice()
	cp := orig.DeepCopy()
	cp.Endpoints[0].Networking.Addressing[0].IPV4 = "10.9.9.9"
	cp.Endpoints[0].NamedPorts[0].Port = 1
	if !reflect.DeepEqual(orig, fullSlice()) {
		t.Fatal("changing the copy changed the original")
	}
}
