package telemetry

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMetricsAddrGivesWorkerIPortPlusI(t *testing.T) {
	for _, tc := range []struct {
		addr   string
		worker int
		want   string
		err    string
	}{
		{"127.0.0.1:9464", 0, "127.0.0.1:9464", ""},
		{"127.0.0.1:9464", 3, "127.0.0.1:9467", ""},
		{":9464", 1, ":9465", ""},
		{"[::1]:9000", 2, "[::1]:9002", ""},
		{"127.0.0.1:0", 5, "127.0.0.1:0", ""},
		{"127.0.0.1:65535", 0, "127.0.0.1:65535", ""},
		{"127.0.0.1:65535", 1, "", "worker 1 would need port 65536"},
		{"9464", 0, "", "want host:port"},
		{"host:-1", 0, "", "want a port number"},
	} {
		got, err := MetricsAddr(tc.addr, tc.worker)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.addr)
			continue
		}
		require.NoError(t, err, tc.addr)
		require.Equal(t, tc.want, got, tc.addr)
	}
}

func TestParseOTLPEndpoint(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Endpoint
	}{
		{"localhost:4318", Endpoint{Host: "localhost:4318", Insecure: true}},
		{":4318", Endpoint{Host: "localhost:4318", Insecure: true}},
		{"http://otel:4318", Endpoint{Host: "otel:4318", Insecure: true}},
		{"https://otel.example:443/otlp", Endpoint{Host: "otel.example:443", Prefix: "/otlp"}},
	} {
		got, err := ParseOTLPEndpoint(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
	for _, bad := range []string{"", "otel", "https://otel", "http://otel:4318/?x=1", "ftp://otel:21", "otel:port"} {
		_, err := ParseOTLPEndpoint(bad)
		require.Error(t, err, bad)
	}
}
