package harness

import "testing"

func TestNamespaceName(t *testing.T) {
	for _, name := range []string{
		"TestFoo", "TestFoo/sub_case#01", "/", "Test" + string(make([]byte, 100)),
		"TestAVeryLongNameThatGoesOnAndOnAndOnWellPastTheSixtyThreeCharacterLimitOfLabels",
	} {
		got := namespaceName(name)
		if len(got) > 63 || len(got) < 7 {
			t.Errorf("namespaceName(%q) = %q: bad length", name, got)
		}
		for i, r := range got {
			ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' && i > 0 && i < len(got)-1
			if !ok {
				t.Errorf("namespaceName(%q) = %q: not a DNS label", name, got)
				break
			}
		}
	}
	if a, b := namespaceName("TestX"), namespaceName("TestX"); a == b {
		t.Errorf("two namespaces for one test share the name %s", a)
	}
}
