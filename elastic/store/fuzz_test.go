package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/internal/testredis"
)

// Fuzz targets for everything elastic reads from Redis: script replies
// (views, heartbeats), member records, Pub/Sub hints, and the job's keys
// themselves as the scripts read them.

// fuzzReply turns a fuzz string into a script reply: fields separated by
// '\x1f'; "\x00" is a nil, a field that parses as an integer is an int64,
// anything else a string (what go-redis hands over for Lua replies).
func fuzzReply(s string) []any {
	var out []any
	for _, f := range strings.Split(s, "\x1f") {
		if f == "\x00" {
			out = append(out, nil)
		} else if n, err := strconv.ParseInt(f, 10, 64); err == nil {
			out = append(out, n)
		} else {
			out = append(out, f)
		}
	}
	return out
}

// FuzzParseView: a view reply of any shape decodes to a view whose ranked
// form is consistent (rank within size, one member per rank), or to an
// error wrapping ErrBadState; never a panic.
func FuzzParseView(f *testing.F) {
	rec := Member{ID: "a", Host: "h", PID: 1, Addr: "127.0.0.1:1"}.record()
	f.Add("0\x1finc\x1f3\x1f2\x1f0\x1f1\x1f0\x1f1\x1f0\x1f0\x1f1\x1f" + rec)
	f.Add("0\x1finc\x1f3\x1f2\x1f1\x1f2\x1f-1\x1f0\x1f0\x1f150\x1f4")
	f.Add("0\x1f\x00\x1f0\x1f0\x1f0\x1f0\x1f-1\x1f0\x1f0\x1f0\x1f0")
	f.Add("9\x1fx")
	f.Fuzz(func(t *testing.T, s string) {
		raw, err := parseView(fuzzReply(s))
		if err != nil {
			if !errors.Is(err, ErrBadState) && !errors.Is(err, strconv.ErrSyntax) && !errors.Is(err, strconv.ErrRange) {
				t.Fatalf("error %v wraps neither ErrBadState nor a number error", err)
			}
			return
		}
		v, err := raw.toView()
		if err != nil {
			if !errors.Is(err, ErrBadState) {
				t.Fatalf("toView error %v does not wrap ErrBadState", err)
			}
			return
		}
		if v.Code < CodeOK || v.Code > CodeFinished || v.Role < RoleNone || v.Role > RolePending || v.Wait < 0 {
			t.Fatalf("out-of-range view %+v", v)
		}
		if v.Role == RoleRanked && (v.Rank < 0 || v.Rank >= v.Size || len(v.Members) != v.Size) {
			t.Fatalf("inconsistent ranked view %+v", v)
		}
		for _, m := range v.Members {
			if m.ID == "" {
				t.Fatalf("member without ID in %+v", v)
			}
		}
	})
}

// FuzzParseRecord: a member record is a Member with an ID or ErrBadState.
func FuzzParseRecord(f *testing.F) {
	f.Add(Member{ID: "a", Host: "h", PID: 1, Addr: "127.0.0.1:1"}.record())
	f.Add(`{"id":""}`)
	f.Add(`{"id":"x","pid":1e400}`)
	f.Add("\xff")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parseRecord(s)
		if err != nil {
			if !errors.Is(err, ErrBadState) {
				t.Fatalf("error %v does not wrap ErrBadState", err)
			}
			return
		}
		if m.ID == "" {
			t.Fatal("accepted a record without ID")
		}
	})
}

// FuzzParseHint: a Pub/Sub message of any content is a hint; when it names
// members, every one has an ID.
func FuzzParseHint(f *testing.F) {
	rec := Member{ID: "a", Addr: "127.0.0.1:1"}.record()
	f.Add("7\n3\ninc\n" + rec + "\n" + rec)
	f.Add("7")
	f.Add("")
	f.Add("18446744073709551615\n18446744073709551615\n\n")
	f.Fuzz(func(t *testing.T, s string) {
		h := parseHint(s)
		if h.Members != nil && h.Version == 0 && s != "" && !strings.HasPrefix(s, "0") {
			t.Fatalf("members without a version from %q", s)
		}
		for _, m := range h.Members {
			if m.ID == "" {
				t.Fatalf("member without ID in hint %+v", h)
			}
		}
	})
}

var fuzzJobSeq atomic.Int64

// FuzzRedisStoreReadsGarbage writes arbitrary values into a job's four
// Redis keys (any of them may also be of the wrong type) and runs every
// store operation over them against a real Redis: each returns a view, or
// an error (an *Error); the scripts never crash the caller.
func FuzzRedisStoreReadsGarbage(f *testing.F) {
	rec := Member{ID: "m1", Host: "h", PID: 1, Addr: "127.0.0.1:1"}.record()
	f.Add(`{"inc":"i","round":2,"prev":1,"floor":2,"ranked":["m1"],"ord":{"m1":1},"ver":5}`, "i", "5", rec, "m1", 1e15, uint8(0))
	f.Add("not json", "", "x", "garbage", "m1", -1e300, uint8(1))
	f.Add(`{"inc":"i","round":1e300,"ver":-3,"dl":9e300,"ranked":["m1","m2","m1"],"pending":{"a":1}}`, "i", "NaN", `{"id":""}`, "m2", 0.0, uint8(0))
	f.Add(`{"inc":"i","open":true,"arrived":["m1"],"expected":[],"back":[],"dl":1}`, "i", "1", rec, "m1", 1e15, uint8(14))
	f.Fuzz(func(t *testing.T, state, inc, ver, record, leaseMember string, leaseScore float64, wrongTypes uint8) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := testredis.Client(t)
		job := fmt.Sprintf("fuzz-garbage-%d-%d", time.Now().UnixNano(), fuzzJobSeq.Add(1))
		keys := jobKeys(job)
		defer c.Del(context.Background(), keys...)
		p := c.TxPipeline()
		set := func(i int, normal func()) {
			if wrongTypes&(1<<i) != 0 {
				p.LPush(ctx, keys[i], "wrong type")
			} else {
				normal()
			}
			p.Expire(ctx, keys[i], time.Minute)
		}
		set(0, func() { p.Set(ctx, keys[0], state, time.Minute) })
		set(1, func() { p.HSet(ctx, keys[1], "inc", inc, "ver", ver, "fin", "0") })
		set(2, func() { p.HSet(ctx, keys[2], "m1", record, leaseMember, record) })
		set(3, func() {
			if leaseScore != leaseScore { // NaN is not a valid score
				leaseScore = 0
			}
			p.ZAdd(ctx, keys[3], redis.Z{Score: leaseScore, Member: leaseMember}, redis.Z{Score: 1e15, Member: "m1"})
		})
		if _, err := p.Exec(ctx); err != nil {
			return // Redis refused the setup (e.g. an invalid score); nothing to test
		}
		s := NewRedis(c)
		params := Params{MinWorkers: 1, MaxWorkers: 4, LastCall: 0, LeaseTTL: time.Second, StateTTL: time.Minute}
		mr := MemberRequest{JobID: job, MemberID: "m1", Incarnation: inc, Params: params}
		check := func(op string, v View, err error) {
			if err != nil {
				var se *Error
				if !errors.As(err, &se) {
					t.Fatalf("%s: error %v is not an *Error", op, err)
				}
				return
			}
			if v.Role == RoleRanked && (v.Rank < 0 || v.Rank >= v.Size || len(v.Members) != v.Size) {
				t.Fatalf("%s: inconsistent ranked view %+v", op, v)
			}
		}
		v, err := s.Check(ctx, mr)
		check("check", v, err)
		_, err = s.Heartbeat(ctx, mr)
		check("heartbeat", View{}, err)
		v, err = s.Report(ctx, ReportRequest{MemberRequest: mr, Round: 2, Target: leaseMember})
		check("report", v, err)
		v, err = s.Join(ctx, JoinRequest{JobID: job, Member: Member{ID: "m1", Addr: "127.0.0.1:1"}, Incarnation: inc,
			NewIncarnation: "new", RoundHint: 1, Peers: []string{leaseMember}, Arrive: true, Params: params})
		check("join", v, err)
		v, err = s.Join(ctx, JoinRequest{JobID: job, Member: Member{ID: "m3", Addr: "127.0.0.1:3"},
			NewIncarnation: "new2", Arrive: true, Params: params})
		check("join newcomer", v, err)
		v, err = s.Leave(ctx, mr)
		check("leave", v, err)
		v, err = s.Finish(ctx, mr)
		check("finish", v, err)
	})
}
