// Package tools pins the S3-compatible server that the tests of the
// objstore/s3 and examples/kubernetes modules build and start: VersityGW
// (Apache-2.0), an S3 gateway whose posix backend keeps buckets as
// directories and objects as files. It is a module of its own so that the
// server's dependencies never enter any other module's requirements (a user
// of the store never downloads them); its go.mod and go.sum pin every byte
// the build uses.
package tools
