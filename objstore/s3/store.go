package s3

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	stdsync "sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/elastictrain/elastictrain/trainer"
)

// Config configures a Store. Endpoint, Bucket and the credentials are
// required; every other field has the default DefaultConfig gives.
type Config struct {
	// Endpoint is the server's host:port (no scheme), e.g.
	// "s3.eu-west-1.amazonaws.com" or "127.0.0.1:7070". Required.
	Endpoint string
	// Secure selects HTTPS. Default true.
	Secure bool
	// Region is the bucket's region; empty lets the client ask the server.
	// Default "".
	Region string
	// PathStyle addresses buckets as endpoint/bucket (most self-hosted
	// S3-compatible servers want it) instead of bucket.endpoint. Default
	// false: the client chooses by the endpoint (virtual-host style for
	// AWS, path style for an IP address or localhost).
	PathStyle bool
	// AccessKey and SecretKey are the static credentials; SessionToken,
	// when set, makes them temporary ones. AccessKey and SecretKey are
	// required.
	AccessKey, SecretKey, SessionToken string
	// Bucket holds the checkpoints; it must exist unless CreateBucket is
	// set. Required.
	Bucket string
	// Prefix is prepended to every object name ("jobs/recsys/"; a "/" is
	// added when it does not end in one). One job's history per prefix:
	// the trainer restores the newest checkpoint under it. Default "".
	Prefix string
	// CreateBucket makes New create Bucket when it does not exist.
	// Default false.
	CreateBucket bool
	// Keep is how many of the newest checkpoints Save keeps (the one it
	// wrote and Keep-1 older ones); 0 keeps every one. Default 3.
	Keep int
	// PartSize is the size in bytes of the objects a payload is cut into
	// (the last one may be smaller); each is written with one PUT. At
	// least 1 KiB and at most 5 GiB (S3's limit of one PUT). Default
	// 16 MiB.
	PartSize int64
	// Parallel is how many parts are written or read at once. Default 4.
	Parallel int
	// MaxRetries bounds the client's retries of one request (with
	// exponential backoff capped at 1 s). Default 10.
	MaxRetries int
	// Transport, when set, carries the client's requests (custom TLS
	// roots, proxies). Default: the client library's.
	Transport http.RoundTripper
}

// DefaultConfig returns a Config with the documented defaults; Endpoint,
// Bucket, AccessKey and SecretKey must still be set.
func DefaultConfig() Config {
	return Config{Secure: true, Keep: 3, PartSize: 16 << 20, Parallel: 4, MaxRetries: 10}
}

// Validate reports the first invalid field, wrapping
// trainer.ErrInvalidConfig.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: s3: "+format, append([]any{trainer.ErrInvalidConfig}, a...)...)
	}
	switch {
	case c.Endpoint == "" || strings.Contains(c.Endpoint, "://") || strings.Contains(c.Endpoint, "/"):
		return bad("Endpoint %q must be host:port, without a scheme or path", c.Endpoint)
	case c.Bucket == "":
		return bad("Bucket is empty")
	case c.AccessKey == "" || c.SecretKey == "":
		return bad("AccessKey and SecretKey are required")
	case strings.HasPrefix(c.Prefix, "/") || strings.Contains(c.Prefix, "//"):
		return bad("Prefix %q must not start with a / or contain //", c.Prefix)
	case c.Keep < 0:
		return bad("Keep %d < 0", c.Keep)
	case c.PartSize < 1<<10 || c.PartSize > 5<<30:
		return bad("PartSize %d outside 1 KiB..5 GiB", c.PartSize)
	case c.Parallel < 1:
		return bad("Parallel %d < 1", c.Parallel)
	case c.MaxRetries < 1:
		return bad("MaxRetries %d < 1", c.MaxRetries)
	}
	return nil
}

// Store is a trainer.CheckpointStore in a bucket of an S3-compatible object
// store (see the package doc for the objects it writes). It also
// implements trainer.TempCleaner. Safe for concurrent use; several
// processes of one job may share one prefix (the trainer writes from rank 0
// only).
type Store struct {
	cfg    Config
	prefix string
	cl     *minio.Client

	// afterPart, when set (tests), runs after part i of a Save was
	// written and before the next one or the manifest.
	afterPart func(step int64, i int)
	// afterUnpublish, when set (tests), runs after prune deleted step's
	// manifest and before it deletes its parts.
	afterUnpublish func(step int64)
}

var (
	_ trainer.CheckpointStore = (*Store)(nil)
	_ trainer.TempCleaner     = (*Store)(nil)
)

// New returns a Store for cfg (validated, zero fields are not defaulted:
// start from DefaultConfig). It checks that the bucket exists (creating it
// when cfg.CreateBucket is set), so wrong credentials, a wrong endpoint or
// a missing bucket are found before the first checkpoint is due. Errors:
// trainer.ErrInvalidConfig for cfg, or the server's.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	lookup := minio.BucketLookupAuto
	if cfg.PathStyle {
		lookup = minio.BucketLookupPath
	}
	cl, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, cfg.SessionToken),
		Secure:       cfg.Secure,
		Region:       cfg.Region,
		BucketLookup: lookup,
		Transport:    cfg.Transport,
		MaxRetries:   cfg.MaxRetries,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: s3: %w", trainer.ErrInvalidConfig, err)
	}
	prefix := cfg.Prefix
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	s := &Store{cfg: cfg, prefix: prefix, cl: cl}
	ok, err := cl.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("s3: bucket %s at %s: %w", cfg.Bucket, cfg.Endpoint, err)
	}
	if !ok && cfg.CreateBucket {
		err = cl.MakeBucket(ctx, cfg.Bucket, minio.MakeBucketOptions{Region: cfg.Region})
		if code := minio.ToErrorResponse(err).Code; code == "BucketAlreadyOwnedByYou" || code == "BucketAlreadyExists" {
			err = nil
		}
		if err != nil {
			return nil, fmt.Errorf("s3: create bucket %s at %s: %w", cfg.Bucket, cfg.Endpoint, err)
		}
		ok = true
	}
	if !ok {
		return nil, fmt.Errorf("s3: bucket %s does not exist at %s (Config.CreateBucket creates it)", cfg.Bucket, cfg.Endpoint)
	}
	return s, nil
}

// Location returns "s3://bucket/prefix", for messages.
func (s *Store) Location() string { return "s3://" + s.cfg.Bucket + "/" + s.prefix }

func (s *Store) key(name string) string { return s.prefix + name }

// Save implements trainer.CheckpointStore: it writes data's parts under a
// new save token, then the manifest (the publication), then deletes the
// parts of a checkpoint of the same step that the manifest replaced, and
// finally the checkpoints beyond the newest Config.Keep (manifest first).
// An error before the manifest's PUT succeeded leaves the published
// checkpoints as they were (the parts written are orphans CleanTemp
// removes).
func (s *Store) Save(ctx context.Context, step int64, data []byte) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("s3: save checkpoint: %w", err)
	}
	if step < 0 {
		return fmt.Errorf("%w: s3: negative checkpoint step %d", trainer.ErrInvalidConfig, step)
	}
	tok := make([]byte, 8)
	if _, err := rand.Read(tok); err != nil {
		return fmt.Errorf("s3: save checkpoint: %w", err)
	}
	token := hex.EncodeToString(tok)
	m := manifest{Format: manifestFormat, Step: step, Size: int64(len(data)), SHA256: sum256(data), Created: time.Now().UTC()}
	for off, i := int64(0), 0; off < int64(len(data)); off, i = off+s.cfg.PartSize, i+1 {
		chunk := data[off:min(off+s.cfg.PartSize, int64(len(data)))]
		m.Parts = append(m.Parts, part{Name: partName(step, token, i), Size: int64(len(chunk)), SHA256: sum256(chunk)})
	}
	// The manifest this one replaces, if any (a step saved again).
	var replaced []part
	if old, err := s.readManifest(ctx, step); err == nil {
		replaced = old.Parts
	}
	err := s.each(ctx, len(m.Parts), func(ctx context.Context, i int) error {
		p := m.Parts[i]
		off := int64(i) * s.cfg.PartSize
		if err := s.put(ctx, p.Name, data[off:off+p.Size]); err != nil {
			return err
		}
		if s.afterPart != nil {
			s.afterPart(step, i)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("s3: save checkpoint of step %d: %w (nothing published)", step, err)
	}
	mb, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("s3: save checkpoint of step %d: %w", step, err)
	}
	if err := s.put(ctx, manifestName(step), mb); err != nil {
		return fmt.Errorf("s3: save checkpoint of step %d: publish the manifest: %w", step, err)
	}
	var errs []error
	for _, p := range replaced {
		if err := s.remove(ctx, p.Name); err != nil {
			errs = append(errs, err)
			break
		}
	}
	if err := s.prune(ctx, step); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("s3: checkpoint of step %d published, but cleaning up failed: %w", step, err)
	}
	return nil
}

// put writes one object with a single PUT, with its MD5 for the server to
// check the body against.
func (s *Store) put(ctx context.Context, name string, b []byte) error {
	info, err := s.cl.PutObject(ctx, s.cfg.Bucket, s.key(name), bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{
		ContentType: "application/octet-stream", SendContentMd5: true, DisableMultipart: true,
	})
	if err != nil {
		return fmt.Errorf("put %s: %w", name, s.ctxErr(ctx, err))
	}
	if info.Size != int64(len(b)) {
		return fmt.Errorf("put %s: the server stored %d of %d bytes", name, info.Size, len(b))
	}
	return nil
}

// ctxErr returns ctx's error, wrapped with err, when ctx ended (so callers
// see context.Canceled or DeadlineExceeded through errors.Is).
func (s *Store) ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: %w", cerr, err)
	}
	return err
}

func (s *Store) remove(ctx context.Context, name string) error {
	err := s.cl.RemoveObject(ctx, s.cfg.Bucket, s.key(name), minio.RemoveObjectOptions{})
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("delete %s: %w", name, s.ctxErr(ctx, err))
	}
	return nil
}

func isNotFound(err error) bool {
	code := minio.ToErrorResponse(err).Code
	return code == "NoSuchKey" || code == "NotFound"
}

// each runs f(ctx, i) for i in [0, n), at most Config.Parallel at once,
// and returns the first error (cancelling the calls still running).
func (s *Store) each(ctx context.Context, n int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    stdsync.WaitGroup
		mu    stdsync.Mutex
		first error
	)
	sem := make(chan struct{}, s.cfg.Parallel)
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(ctx, i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
				cancel()
			}
		}()
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return first
}

// prune keeps the checkpoint just saved and the Keep-1 newest older ones
// and deletes the other older ones: each one's manifest first (so it is
// never listed with parts missing), then every object under its parts.
// Checkpoints of later steps are another history's (a job restored from an
// older checkpoint): left alone, and they do not count.
func (s *Store) prune(ctx context.Context, just int64) error {
	if s.cfg.Keep == 0 {
		return nil
	}
	steps, err := s.List(ctx)
	if err != nil {
		return err
	}
	kept := 1
	for _, st := range steps { // newest first
		if st >= just {
			continue
		}
		if kept < s.cfg.Keep {
			kept++
			continue
		}
		if err := s.remove(ctx, manifestName(st)); err != nil {
			return fmt.Errorf("prune step %d: %w", st, err)
		}
		if s.afterUnpublish != nil {
			s.afterUnpublish(st)
		}
		if err := s.removeAll(ctx, partsDir(st)); err != nil {
			return fmt.Errorf("prune step %d: %w", st, err)
		}
	}
	return nil
}

// removeAll deletes every object whose name starts with dir.
func (s *Store) removeAll(ctx context.Context, dir string) error {
	names, err := s.names(ctx, dir, true)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := s.remove(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// names lists the objects under dir (names relative to the prefix);
// without recursive, only those directly under it.
func (s *Store) names(ctx context.Context, dir string, recursive bool) ([]string, error) {
	var out []string
	for obj := range s.cl.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: s.key(dir), Recursive: recursive}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("list %s: %w", s.key(dir), s.ctxErr(ctx, obj.Err))
		}
		name, ok := strings.CutPrefix(obj.Key, s.prefix)
		if !ok || strings.HasSuffix(name, "/") {
			continue
		}
		out = append(out, name)
	}
	return out, nil
}

// List implements trainer.CheckpointStore: the steps of the published
// manifests, newest first. A manifest is published by one PUT, after
// every part it names, and deleted before any of them, so a listed step's
// parts were all written (Load still verifies them).
func (s *Store) List(ctx context.Context) ([]int64, error) {
	names, err := s.names(ctx, ckptPrefix, false)
	if err != nil {
		return nil, fmt.Errorf("s3: list checkpoints: %w", err)
	}
	var steps []int64
	for _, n := range names {
		if st, ok := parseManifestName(n); ok {
			steps = append(steps, st)
		}
	}
	slices.Sort(steps)
	slices.Reverse(steps)
	return slices.Compact(steps), nil
}

// readManifest reads and checks step's manifest. ErrNoCheckpoint when
// there is none; trainer.ErrCorruptCheckpoint when it does not decode.
func (s *Store) readManifest(ctx context.Context, step int64) (manifest, error) {
	m, _, err := s.readManifestETag(ctx, step)
	return m, err
}

func (s *Store) readManifestETag(ctx context.Context, step int64) (manifest, string, error) {
	b, etag, err := s.get(ctx, manifestName(step), maxManifestBytes)
	if isNotFound(err) {
		return manifest{}, "", fmt.Errorf("%w: step %d", trainer.ErrNoCheckpoint, step)
	}
	if errors.Is(err, errTooLarge) {
		return manifest{}, etag, fmt.Errorf("%w: manifest larger than %d bytes", trainer.ErrCorruptCheckpoint, maxManifestBytes)
	}
	if err != nil {
		return manifest{}, "", err
	}
	m, err := decodeManifest(b, step)
	return m, etag, err
}

var errTooLarge = errors.New("object larger than expected")

// get reads one object of at most limit bytes, and its ETag.
func (s *Store) get(ctx context.Context, name string, limit int64) ([]byte, string, error) {
	obj, err := s.cl.GetObject(ctx, s.cfg.Bucket, s.key(name), minio.GetObjectOptions{})
	if err != nil {
		return nil, "", s.ctxErr(ctx, err)
	}
	defer obj.Close()
	info, err := obj.Stat()
	if err != nil {
		return nil, "", s.ctxErr(ctx, err)
	}
	if info.Size > limit {
		return nil, info.ETag, fmt.Errorf("%s: %w: %d bytes, at most %d", name, errTooLarge, info.Size, limit)
	}
	b, err := io.ReadAll(io.LimitReader(obj, limit+1))
	if err != nil {
		return nil, "", fmt.Errorf("get %s: %w", name, s.ctxErr(ctx, err))
	}
	if int64(len(b)) > limit {
		return nil, info.ETag, fmt.Errorf("%s: %w: more than %d bytes", name, errTooLarge, limit)
	}
	return b, info.ETag, nil
}

// Load implements trainer.CheckpointStore: it reads step's manifest, then
// every part it names (Config.Parallel at once), checking each part's
// size and SHA-256, and the whole payload's. ErrNoCheckpoint when no
// manifest of step is published; trainer.ErrCorruptCheckpoint when the
// manifest does not decode or a part is missing, of another size or
// checksum; then the manifest is set aside under "corrupt/" (copied, then
// deleted, only if it is still the one that was read), so List no longer
// returns it (the copy is kept for inspection; the parts it names are
// then orphans, which CleanTemp removes). Other errors (network,
// credentials) are returned as they are and change nothing.
func (s *Store) Load(ctx context.Context, step int64) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("s3: load checkpoint: %w", err)
	}
	m, etag, err := s.readManifestETag(ctx, step)
	var data []byte
	if err == nil {
		data, err = s.readParts(ctx, m)
	}
	if errors.Is(err, trainer.ErrCorruptCheckpoint) && etag != "" {
		if aside, serr := s.setAside(ctx, step, etag); serr == nil {
			err = fmt.Errorf("%w (manifest set aside as %s)", err, aside)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("s3: load checkpoint of step %d from %s: %w", step, s.Location(), err)
	}
	return data, nil
}

// readParts reads and verifies every part m names. Memory follows what the
// server holds, not what the manifest claims: a part is read up to its
// claimed size plus one byte, and the payload is assembled only once every
// part verified (a damaged manifest claiming an exabyte costs nothing).
func (s *Store) readParts(ctx context.Context, m manifest) ([]byte, error) {
	got := make([][]byte, len(m.Parts))
	err := s.each(ctx, len(m.Parts), func(ctx context.Context, i int) error {
		p := m.Parts[i]
		b, _, err := s.get(ctx, p.Name, p.Size)
		switch {
		case isNotFound(err):
			return fmt.Errorf("%w: part %s is missing", trainer.ErrCorruptCheckpoint, p.Name)
		case errors.Is(err, errTooLarge):
			return fmt.Errorf("%w: part %s is larger than the %d bytes the manifest says", trainer.ErrCorruptCheckpoint, p.Name, p.Size)
		case err != nil:
			return err
		case int64(len(b)) != p.Size:
			return fmt.Errorf("%w: part %s has %d bytes, the manifest says %d", trainer.ErrCorruptCheckpoint, p.Name, len(b), p.Size)
		case sum256(b) != p.SHA256:
			return fmt.Errorf("%w: part %s: SHA-256 mismatch", trainer.ErrCorruptCheckpoint, p.Name)
		}
		got[i] = b
		return nil
	})
	if err != nil {
		return nil, err
	}
	data := bytes.Join(got, nil)
	if data == nil {
		data = []byte{}
	}
	if sum256(data) != m.SHA256 {
		return nil, fmt.Errorf("%w: payload SHA-256 mismatch", trainer.ErrCorruptCheckpoint)
	}
	return data, nil
}

// setAside copies step's manifest, if its ETag is still etag, to
// "corrupt/<name>.<unix nanoseconds>" and deletes it; it returns the new
// name.
func (s *Store) setAside(ctx context.Context, step int64, etag string) (string, error) {
	name := manifestName(step)
	aside := fmt.Sprintf("%s%s.%d", corruptDir, name, time.Now().UnixNano())
	_, err := s.cl.CopyObject(ctx,
		minio.CopyDestOptions{Bucket: s.cfg.Bucket, Object: s.key(aside)},
		minio.CopySrcOptions{Bucket: s.cfg.Bucket, Object: s.key(name), MatchETag: etag})
	if err != nil {
		return "", err
	}
	if err := s.remove(ctx, name); err != nil {
		return "", err
	}
	return aside, nil
}

// CleanTemp implements trainer.TempCleaner: it deletes the parts that no
// published manifest names (the parts of Saves that never published:
// the writer or the server died first) and returns their names. The
// trainer calls it only when no Save of the job can be in flight.
func (s *Store) CleanTemp(ctx context.Context) ([]string, error) {
	names, err := s.names(ctx, ckptPrefix, true)
	if err != nil {
		return nil, fmt.Errorf("s3: clean checkpoints: %w", err)
	}
	live := map[int64]string{} // step -> the published manifest's token
	for _, n := range names {
		if st, ok := parseManifestName(n); ok {
			m, err := s.readManifest(ctx, st)
			switch {
			case errors.Is(err, trainer.ErrNoCheckpoint):
			case err != nil:
				// Not decodable, or not readable now: keep its parts (Load
				// sets a damaged one aside).
				live[st] = "*"
			case len(m.Parts) > 0:
				_, tok, _ := parsePartName(m.Parts[0].Name)
				live[st] = tok
			default:
				live[st] = ""
			}
		}
	}
	var removed []string
	for _, n := range names {
		st, tok, ok := parsePartName(n)
		if !ok {
			continue
		}
		if lt, published := live[st]; published && (lt == "*" || lt == tok) {
			continue
		}
		if err := s.remove(ctx, n); err != nil {
			return removed, fmt.Errorf("s3: clean checkpoints: %w", err)
		}
		removed = append(removed, n)
	}
	return removed, nil
}
