package s3

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/elastictrain/elastictrain/trainer"
)

// manifestFormat names version 1 of the manifest (see the package doc).
const manifestFormat = "elastictrain-s3-checkpoint/1"

// maxManifestBytes bounds a manifest read from the store: a manifest
// names at most maxParts parts of about 200 bytes each.
const (
	maxParts         = 100_000
	maxManifestBytes = 32 << 20
)

// manifest is the object that publishes a checkpoint: it names every part
// of the payload, in order, with its size and SHA-256, and the whole
// payload's size and SHA-256.
type manifest struct {
	Format  string    `json:"format"`
	Step    int64     `json:"step"`
	Size    int64     `json:"size"`
	SHA256  string    `json:"sha256"`
	Created time.Time `json:"created"`
	Parts   []part    `json:"parts"`
}

// part is one object of a checkpoint's payload. Name is relative to the
// store's prefix.
type part struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

func sum256(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// decodeManifest parses a manifest read from the store for step and checks
// everything that can be checked without the parts: the format, the step,
// that the parts' sizes add up to the payload's, and that every part is
// named under this step's parts (so a damaged manifest cannot make Load
// read, or a set-aside delete, another checkpoint's objects). Errors wrap
// trainer.ErrCorruptCheckpoint.
func decodeManifest(b []byte, step int64) (manifest, error) {
	var m manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("%w: manifest: %v", trainer.ErrCorruptCheckpoint, err)
	}
	if dec.More() {
		return m, fmt.Errorf("%w: manifest: trailing data", trainer.ErrCorruptCheckpoint)
	}
	bad := func(format string, a ...any) (manifest, error) {
		return m, fmt.Errorf("%w: manifest: "+format, append([]any{trainer.ErrCorruptCheckpoint}, a...)...)
	}
	switch {
	case m.Format != manifestFormat:
		return bad("format %q, want %q", m.Format, manifestFormat)
	case m.Step != step:
		return bad("says step %d, its name %d", m.Step, step)
	case m.Size < 0:
		return bad("negative size %d", m.Size)
	case len(m.Parts) > maxParts:
		return bad("%d parts, more than %d", len(m.Parts), maxParts)
	case !isSHA256(m.SHA256):
		return bad("bad payload checksum %q", m.SHA256)
	}
	dir := partsDir(step)
	var total int64
	for i, p := range m.Parts {
		rest, ok := strings.CutPrefix(p.Name, dir)
		switch {
		case !ok || rest == "" || strings.Contains(rest, "..") || strings.HasPrefix(rest, "/"):
			return bad("part %d is named %q, outside %s", i, p.Name, dir)
		case p.Size <= 0 || p.Size > m.Size-total:
			return bad("part %d has size %d (payload %d, %d before it)", i, p.Size, m.Size, total)
		case !isSHA256(p.SHA256):
			return bad("part %d has a bad checksum %q", i, p.SHA256)
		}
		total += p.Size
	}
	if total != m.Size {
		return bad("parts hold %d bytes, the payload is %d", total, m.Size)
	}
	return m, nil
}

func isSHA256(s string) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == sha256.Size
}

// Object names, relative to the store's prefix. Steps are zero-padded to
// 20 digits so that names sort by step.
const (
	ckptPrefix      = "ckpt-"
	manifestSuffix  = ".manifest"
	partsSuffix     = ".parts/"
	corruptDir      = "corrupt/"
	stepDigits      = 20
	manifestNameLen = len(ckptPrefix) + stepDigits + len(manifestSuffix)
)

func manifestName(step int64) string {
	return fmt.Sprintf("%s%0*d%s", ckptPrefix, stepDigits, step, manifestSuffix)
}

// partsDir is the name every part of step's checkpoints starts with.
func partsDir(step int64) string {
	return fmt.Sprintf("%s%0*d%s", ckptPrefix, stepDigits, step, partsSuffix)
}

// partName names part i of the save token of step.
func partName(step int64, token string, i int) string {
	return fmt.Sprintf("%s%s/%06d", partsDir(step), token, i)
}

// parseManifestName returns the step of a manifest's name, exactly as
// manifestName writes it (an unpadded or otherwise foreign name is not
// one of ours).
func parseManifestName(name string) (int64, bool) {
	if len(name) != manifestNameLen || !strings.HasPrefix(name, ckptPrefix) || !strings.HasSuffix(name, manifestSuffix) {
		return 0, false
	}
	var step int64
	for _, c := range name[len(ckptPrefix) : len(ckptPrefix)+stepDigits] {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := int64(c - '0')
		if step > (1<<63-1-d)/10 {
			return 0, false
		}
		step = step*10 + d
	}
	return step, true
}

// parsePartName splits a part's name into its step and save token.
func parsePartName(name string) (step int64, token string, ok bool) {
	// ckpt-<20 digits>.parts/<token>/<index>
	head := len(ckptPrefix) + stepDigits
	if len(name) <= head+len(partsSuffix) || !strings.HasPrefix(name, ckptPrefix) || name[head:head+len(partsSuffix)] != partsSuffix {
		return 0, "", false
	}
	step, ok = parseManifestName(name[:head] + manifestSuffix)
	if !ok {
		return 0, "", false
	}
	token, _, ok = strings.Cut(name[head+len(partsSuffix):], "/")
	return step, token, ok && token != ""
}
