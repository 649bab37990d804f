package paramserver

// Internals the external tests (package paramserver_test, which import
// package sync for its Transport) use.
var (
	PSTables = psTables
	NameHash = psNameHash
	InitRow  = psInitRow
	Apply    = psApply
)

// EachHeldRow calls f with every row of every table held by the shards r
// hosts on this rank (once their rows are in place): its table, row ID,
// shard and views of its values and optimizer state, valid during the call.
func EachHeldRow(r *Round, f func(table int, row int64, shard int, val, st []float32)) {
	for _, sh := range r.local {
		if sh == nil {
			continue
		}
		<-sh.ready
		func() {
			sh.mu.Lock()
			defer sh.mu.Unlock()
			for tb := range sh.data.tables {
				tab := &sh.data.tables[tb]
				d, sd := int64(tab.dim), int64(tab.sdim)
				for l := int64(0); l < tab.n; l++ {
					f(tb, l*int64(r.shards)+int64(sh.idx), sh.idx, tab.val[l*d:(l+1)*d], tab.st[l*sd:(l+1)*sd])
				}
			}
		}()
	}
}

// WriteRaw writes b on r's stream to rank q, between whole frames.
func WriteRaw(r *Round, q int, b []byte) {
	p := r.peers[q]
	p.wmu.Lock()
	defer p.wmu.Unlock()
	p.conn.Write(b)
}
