package ps

import (
	"testing"
)

// Manifests come from a checkpoint file: any bytes give an error or a
// restore set naming only files inside Dir, never a panic.
func FuzzManifest(f *testing.F) {
	f.Add([]byte(`{"format":"elastictrain-ps/1","name":"ps","step":3,"ps_step":3,"shards":1,"tables":"0","files":[{"shard":0,"path":"ckpt-1-a/x.bin","size":10,"sha256":"00"}]}`))
	f.Add([]byte(`{"format":"elastictrain-ps/1","shards":65536,"files":[{"shard":-1,"path":"/etc/passwd"}]}`))
	f.Add([]byte(`null`))
	cfg := DefaultConfig()
	cfg.Tables, cfg.Dir = tables(), f.TempDir()
	cfg.Sync.JobID, cfg.Sync.Secret = "fuzz", []byte("fuzz secret of 32 bytes, at least")
	p, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		set, err := p.parseManifests(3, [][]byte{b, b})
		if err == nil && len(set.files) != set.shards {
			t.Fatalf("accepted %d files for %d shards", len(set.files), set.shards)
		}
	})
}
