package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/objstore/s3"
	"github.com/elastictrain/elastictrain/trainer"
)

// An s3:// location and the AWS variables make the store's Config; what
// is missing or malformed is an invalid configuration, named.
func TestS3ConfigFromTheLocationAndTheEnvironment(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	keys := []string{"AWS_ACCESS_KEY_ID", "id", "AWS_SECRET_ACCESS_KEY", "secret"}

	cfg, err := s3Config("s3://ckpts/jobs/mnist", env(keys...))
	require.NoError(t, err)
	want := s3.DefaultConfig()
	want.Endpoint, want.Secure = "s3.amazonaws.com", true
	want.Bucket, want.Prefix, want.AccessKey, want.SecretKey = "ckpts", "jobs/mnist", "id", "secret"
	require.Equal(t, want, cfg, "AWS S3 by default")

	cfg, err = s3Config("s3://ckpts", env(append(keys, "AWS_ENDPOINT_URL", "http://minio.minio:9000", "AWS_REGION", "eu-1", "AWS_SESSION_TOKEN", "tok")...))
	require.NoError(t, err)
	require.Equal(t, [6]any{"minio.minio:9000", false, "eu-1", "tok", "ckpts", ""},
		[6]any{cfg.Endpoint, cfg.Secure, cfg.Region, cfg.SessionToken, cfg.Bucket, cfg.Prefix})

	cfg, err = s3Config("s3://b/p", env(append(keys, "AWS_ENDPOINT_URL", "http://a:1", "AWS_ENDPOINT_URL_S3", "https://b:2/", "AWS_DEFAULT_REGION", "r")...))
	require.NoError(t, err)
	require.Equal(t, [3]any{"b:2", true, "r"}, [3]any{cfg.Endpoint, cfg.Secure, cfg.Region}, "the S3-specific endpoint first")

	for _, c := range []struct {
		loc  string
		env  []string
		want string
	}{
		{"s3:///p", keys, "want s3://BUCKET/PREFIX"},
		{"s3://b/p", keys[:2], "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must hold"},
		{"s3://b/p", append(keys, "AWS_ENDPOINT_URL", "minio:9000"), `endpoint "minio:9000": want http(s)://host[:port]`},
		{"s3://b/p", append(keys, "AWS_ENDPOINT_URL", "https://h/path"), "want http(s)://host[:port]"},
		{"s3://b//p", keys, "must not start with a / or contain //"},
	} {
		_, err := s3Config(c.loc, env(c.env...))
		require.ErrorIs(t, err, trainer.ErrInvalidConfig, "%s %q", c.loc, c.env)
		require.ErrorContains(t, err, c.want, "%s %q", c.loc, c.env)
	}
}

// A location that is not s3:// is a local directory, as examples/mnist's.
func TestOtherLocationsAreLocalDirectories(t *testing.T) {
	dir := t.TempDir()
	st, err := openCheckpoints(t.Context(), dir, func(string) string { return "" })
	require.NoError(t, err)
	require.NoError(t, st.Save(t.Context(), 7, []byte("x")))
	steps, err := st.List(t.Context())
	require.NoError(t, err)
	require.Equal(t, []int64{7}, steps)
}
