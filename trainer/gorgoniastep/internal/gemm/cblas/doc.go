// Package cblas calls OpenBLAS's cblas_sgemm through cgo for package gemm
// in builds with -tags openblas (link flags -lopenblas: Debian's
// libopenblas-dev). Without the tag it is empty. It is a package of its
// own because Go does not allow cgo and Go assembly in one package.
package cblas
