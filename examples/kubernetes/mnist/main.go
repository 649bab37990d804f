// Command mnist is the worker of the Kubernetes example's image: the mnist
// command of examples/mnist (package examples/internal/mnist, the same
// flags), whose -checkpoint takes an S3 location as well as a directory, so
// the Job's pods keep their checkpoints in object storage and share no
// filesystem.
//
//	-checkpoint s3://BUCKET/PREFIX   checkpoints in BUCKET under PREFIX
//	                                 (objstore/s3: one job's history per prefix)
//	-checkpoint DIR                  a local directory, as examples/mnist's
//
// An S3 location takes the rest from the environment, the names the AWS
// tools use:
//
//	AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL   the server, http(s)://host[:port]
//	                                          (default https://s3.amazonaws.com)
//	AWS_REGION or AWS_DEFAULT_REGION          the bucket's region (default: asked
//	                                          of the server)
//	AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY  static credentials (required)
//	AWS_SESSION_TOKEN                         with temporary ones
//
// Any S3-compatible server will do (AWS S3, MinIO, Ceph RGW, ...); the
// bucket must exist. The S3 client (module objstore/s3, minio-go) is this
// module's requirement, not the examples module's: `go run ./examples/mnist`
// never downloads it.
package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/elastictrain/elastictrain/examples/internal/mnist"
	"github.com/elastictrain/elastictrain/objstore/s3"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/checkpoint"
)

// keep is how many of the newest checkpoints a store keeps (as
// examples/mnist's local directory does).
const keep = 3

func main() {
	os.Exit(mnist.Main(os.Args[1:], os.Stdout, os.Stderr, mnist.Options{
		OpenCheckpoints: func(ctx context.Context, location string) (trainer.CheckpointStore, error) {
			return openCheckpoints(ctx, location, os.Getenv)
		},
		CheckpointHelp: "durable checkpoints: s3://BUCKET/PREFIX (endpoint and credentials from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or a directory (default: none; a whole-job restart then starts over)",
	}))
}

// openCheckpoints opens the store location names: an S3 bucket and
// prefix for s3://BUCKET/PREFIX (s3.New, which checks that the bucket
// exists and the credentials are taken), a local directory otherwise.
func openCheckpoints(ctx context.Context, location string, getenv func(string) string) (trainer.CheckpointStore, error) {
	if !strings.HasPrefix(location, "s3://") {
		return checkpoint.NewLocalDir(location, keep)
	}
	cfg, err := s3Config(location, getenv)
	if err != nil {
		return nil, err
	}
	return s3.New(ctx, cfg)
}

// s3Config is the s3.Config of location (s3://BUCKET/PREFIX) and the
// environment read by getenv. Errors wrap trainer.ErrInvalidConfig.
func s3Config(location string, getenv func(string) string) (s3.Config, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: -checkpoint %s: "+format, append([]any{trainer.ErrInvalidConfig, location}, a...)...)
	}
	cfg := s3.DefaultConfig()
	cfg.Keep = keep
	cfg.Bucket, cfg.Prefix, _ = strings.Cut(strings.TrimPrefix(location, "s3://"), "/")
	if cfg.Bucket == "" {
		return s3.Config{}, bad("want s3://BUCKET/PREFIX")
	}
	endpoint := first(getenv, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
	if endpoint == "" {
		endpoint = "https://s3.amazonaws.com"
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.User != nil {
		return s3.Config{}, bad("endpoint %q: want http(s)://host[:port]", endpoint)
	}
	cfg.Endpoint, cfg.Secure = u.Host, u.Scheme == "https"
	cfg.Region = first(getenv, "AWS_REGION", "AWS_DEFAULT_REGION")
	cfg.AccessKey, cfg.SecretKey = getenv("AWS_ACCESS_KEY_ID"), getenv("AWS_SECRET_ACCESS_KEY")
	cfg.SessionToken = getenv("AWS_SESSION_TOKEN")
	if cfg.AccessKey == "" || cfg.SecretKey == "" {
		return s3.Config{}, bad("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must hold the bucket's credentials")
	}
	return cfg, cfg.Validate()
}

// first returns the first non-empty value of the variables names.
func first(getenv func(string) string, names ...string) string {
	for _, n := range names {
		if v := getenv(n); v != "" {
			return v
		}
	}
	return ""
}
