package hostaddr

import "testing"

func TestKey(t *testing.T) {
	for _, c := range []struct{ addr, want string }{
		{"10.0.0.1:29500", "10.0.0.1"},
		{"[::ffff:10.0.0.1]:29500", "10.0.0.1"},
		{"[fe80::1%eth0]:1", "fe80::1"},
		{"[2001:DB8::1]:1", "2001:db8::1"},
		{"Pod-A.Example:80", "pod-a.example"},
		{"pod-a", "pod-a"},
		{"", ""},
	} {
		if got := Key(c.addr); got != c.want {
			t.Errorf("Key(%q) = %q, want %q", c.addr, got, c.want)
		}
	}
}
