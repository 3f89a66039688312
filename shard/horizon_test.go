package shard

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/wheel"
)

// TestLoadRacesApply drives the load protocol against the observer by hand,
// in each order the two can meet: an event applied while its range is being
// read is in the wheel once, one settled meanwhile does not come back, one
// in a fire batch is not added beside it, and a load whose wheel was rebuilt
// adds nothing.
func TestLoadRacesApply(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	f, base := testFiring(t, &now, time.Second)

	ms := func(n int64) int64 { return base + n*int64(time.Millisecond) }
	f.scheduled(1, ms(500), raftfsm.DefaultPolicy)  // within the horizon: in the wheel
	f.scheduled(2, ms(1500), raftfsm.DefaultPolicy) // beyond it: left to the loader
	if n, _ := f.horizon(); n != 1 {
		t.Fatalf("wheel holds %d events, want 1 (the one beyond the horizon stays on disk)", n)
	}

	from, gen, ok := f.beginLoad(ms(2000))
	if !ok || from != ms(1000) {
		t.Fatalf("beginLoad = %d, %v; want from the old horizon %d", from, ok, ms(1000))
	}
	if _, _, ok := f.beginLoad(ms(1500)); ok {
		t.Fatal("beginLoad moved the horizon backwards")
	}
	// Applied while the range is read: the observer adds them now.
	f.scheduled(3, ms(1600), raftfsm.DefaultPolicy)
	f.scheduled(4, ms(1700), raftfsm.DefaultPolicy)
	f.settled(4)                 // and this one settles before the read reaches it
	f.settled(5)                 // settled before the load saw it, never in the wheel
	f.inflight[6] = &fireBatch{} // taken out by the firing loop meanwhile
	// The read saw 2 and 5 (before 5 settled), 3 and 4 (after they were
	// applied), and 6.
	p := raftfsm.DefaultPolicy
	read := []loaded{{2, ms(1500), p}, {3, ms(1600), p}, {4, ms(1700), p}, {5, ms(1800), p}, {6, ms(1900), p}}
	if !f.addLoaded(gen, read) {
		t.Fatal("addLoaded refused the current wheel")
	}
	f.endLoad(gen)
	delete(f.inflight, 6)
	got := map[uint64]int{}
	for _, e := range f.wheel.Advance(ms(3000), nil, 0) {
		got[e.Ref]++
	}
	want := map[uint64]int{1: 1, 2: 1, 3: 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the wheel gave %v, want %v (each pending event once; nothing settled, nothing in flight)", got, want)
	}
	if len(f.gone) != 0 {
		t.Fatalf("%d settled events still remembered after the load", len(f.gone))
	}

	// A rebuild during a load: what the load read belongs to the old wheel.
	_, gen, _ = f.beginLoad(ms(4000))
	w2, _ := wheel.New(ms(3000), time.Millisecond)
	f.replace(newWheelSet(w2), ms(4000))
	if f.addLoaded(gen, []loaded{{7, ms(3500), p}}) {
		t.Fatal("addLoaded added to a wheel rebuilt since the load began")
	}
	if n, _ := f.horizon(); n != 0 {
		t.Fatalf("the rebuilt wheel holds %d events, want 0", n)
	}
}

// TestHorizonFiresEventsAsItReachesThem: with a 1 s horizon, a shard holds in
// its wheel only the events due within about a second, and fires every event,
// those scheduled beyond the horizon and those due right at its edge, once,
// none early, while events are scheduled and cancelled throughout; a cancel
// of an event still on disk holds.
func TestHorizonFiresEventsAsItReachesThem(t *testing.T) {
	brokers := publishtest.NewBroker(t).Addrs()
	n := openNode(t, t.TempDir(), "", brokers, 2, func(tu *Tuning) {
		tu.WheelHorizon = time.Second
		tu.ClockSkewBound = 10 * time.Millisecond // no predecessor to fence off
	})
	defer n.close()
	c := publishtest.Collect(t, brokers, "h")
	rng := rand.New(rand.NewPCG(7, 7))
	horizon := n.host.Replica(0).tune.WheelHorizon
	step := n.host.Replica(0).tune.loadStep()

	type sent struct {
		due       int64
		cancelled bool
	}
	events := map[string]*sent{}
	var ids []string
	request := func(id string, delay time.Duration) Request {
		r := Request{ID: id, Delay: delay, HasDelay: true, Topic: "h", Payload: []byte(id)}
		r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(r.Delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
		return r
	}
	schedule := func(reqs ...Request) {
		res, err := n.host.Schedule(context.Background(), reqs)
		if err != nil {
			t.Fatalf("Schedule: %v", err)
		}
		for i, r := range res {
			if r.Outcome != raftfsm.Created {
				t.Fatalf("Schedule %s: %+v", reqs[i].ID, r)
			}
			events[reqs[i].ID] = &sent{due: r.Due}
			ids = append(ids, reqs[i].ID)
		}
	}
	cancelSome := func() {
		for range 1 {
			id := ids[rng.IntN(len(ids))]
			e := events[id]
			if e.cancelled || time.Until(time.Unix(0, e.due)) < 300*time.Millisecond {
				continue // leave the firing loop's way alone: cancels of due events are tested elsewhere
			}
			r, err := n.host.Cancel(context.Background(), id, nil)
			if err != nil || r.Outcome != raftfsm.Cancelled {
				t.Fatalf("Cancel %s (due in %v): %v %+v", id, time.Until(time.Unix(0, e.due)), err, r)
			}
			e.cancelled = true
		}
	}
	start := time.Now()
	var far []Request
	for i := range 400 {
		far = append(far, request(fmt.Sprintf("far-%d", i), 2*time.Second+time.Duration(rng.Int64N(int64(2*time.Second)))))
	}
	schedule(far...)
	// Right after scheduling, the wheels hold at most what falls due within
	// the horizon and one load step: none of these.
	for _, s := range n.host.shards {
		if in, ahead := s.WheelEvents(); in != 0 || ahead > horizon+step || ahead < horizon-step-time.Since(start) {
			t.Fatalf("shard %d: %d events in the wheel, every pending one held %v ahead; want none, about %v ahead", s.ID(), in, ahead, horizon)
		}
	}
	// Then, for three seconds, events due around the horizon's edge and
	// across it, and cancels, while the horizon moves.
	for i := 0; time.Since(start) < 3*time.Second; i++ {
		edge := horizon + time.Duration(rng.Int64N(int64(2*step))) - step
		schedule(request(fmt.Sprintf("edge-%d", i), edge),
			request(fmt.Sprintf("near-%d", i), time.Duration(rng.Int64N(int64(3*time.Second)))))
		cancelSome()
		// Left a sleep: it spreads the schedules over the three seconds, so
		// that their due times meet the moving horizon at every point of a
		// load step; there is no condition to wait for.
		time.Sleep(2 * time.Millisecond)
	}
	want := 0
	for _, e := range events {
		if !e.cancelled {
			want++
		}
	}
	c.WaitIDs(want, 30*time.Second)
	// A duplicate, or a record of a cancelled event, would have been
	// produced before every replica settled all it took out of its wheel.
	waitAllRead(t, brokers, "h", c, n.host.shards...)
	got := c.Consumed()
	for id, e := range events {
		r, fired := got.ByID[id]
		switch {
		case e.cancelled && fired:
			t.Errorf("%s was cancelled and fired", id)
		case !e.cancelled && !fired:
			t.Errorf("%s (due %v after the test began) never fired", id, time.Unix(0, e.due).Sub(start))
		case fired && r.Fired.Before(time.Unix(0, e.due).Truncate(time.Millisecond)):
			t.Errorf("%s fired %v early", id, time.Unix(0, e.due).Sub(r.Fired))
		}
	}
	if got.Dups != 0 {
		t.Errorf("%d duplicate records from one replica that never lost leadership", got.Dups)
	}
	t.Logf("%d events, %d cancelled, %d fired", len(events), len(events)-want, len(got.ByID))
}

// TestPowerCutDuringHorizonLoad: power cuts in the middle of loads of the
// horizon, at a different chunk each time, with events scheduled beyond the
// horizon and some of them cancelled: after each cut the replica reopens on
// what Pebble had synced plus its Raft log, and in the end every
// acknowledged event not cancelled fires, once and not early, and no
// cancelled one does. A load writes nothing, so what it must not lose is
// only in memory; the reopened replica must rebuild it all.
func TestPowerCutDuringHorizonLoad(t *testing.T) {
	broker := publishtest.NewBroker(t)
	pub, err := publish.New(publish.Config{Brokers: broker.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	c := publishtest.Collect(t, broker.Addrs(), "cut")
	r := newCrashRig(t)
	r.pub = pub
	r.tune = func(tu *Tuning) {
		tu.WheelHorizon = time.Second
		tu.ClockSkewBound = 10 * time.Millisecond
	}
	// Each round arms cutAfter, which the replica's loads call after each chunk of 8.
	var cutAfter atomic.Pointer[func()]
	r.knobs = Knobs{LoadChunk: 8, HorizonLoaded: func() {
		if hook := cutAfter.Load(); hook != nil {
			(*hook)()
		}
	}}

	rng := rand.New(rand.NewPCG(5, 5))
	s := r.mustOpen(true)
	type sent struct {
		due       int64
		cancelled bool
	}
	events := map[string]*sent{}
	for round := range 3 {
		waitFor(t, 10*time.Second, "the shard has a leader", s.IsLeader)
		// Two batches, with a Raft snapshot between them: the snapshot
		// flushes Pebble, so the reopened replica finds the first batch
		// there (its wheel rebuilt from Pebble, the rest loaded as the
		// horizon reaches it) and the second only in its Raft log, which
		// it applies again.
		for batch := range 2 {
			var reqs []Request
			for i := range 100 {
				q := Request{ID: fmt.Sprintf("r%d-%d-%d", round, batch, i), Delay: 200*time.Millisecond + time.Duration(rng.Int64N(int64(2300*time.Millisecond))),
					HasDelay: true, Topic: "cut", Payload: []byte("p")}
				q.ContentHash = raftfsm.ContentHash(q.Topic, q.Key, q.Payload, nil, 0, int64(q.Delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
				reqs = append(reqs, q)
			}
			res, err := s.Schedule(context.Background(), reqs)
			if err != nil {
				t.Fatal(err)
			}
			for i, q := range reqs {
				events[q.ID] = &sent{due: res[i].Due}
				if q.Delay < 1500*time.Millisecond || i%3 != 0 {
					continue
				}
				// Until a new leader has passed its barrier it cannot tell what
				// its predecessor produced, and refuses cancels.
				var cr raftfsm.CancelResult
				var err error
				waitFor(t, 5*time.Second, "a cancel past the new leader's barrier", func() bool {
					cr, err = s.Cancel(context.Background(), q.ID, nil)
					return !errors.Is(err, ErrProduceUnknown)
				})
				if err != nil || cr.Outcome != raftfsm.Cancelled {
					t.Fatalf("Cancel %s: %v %+v", q.ID, err, cr)
				}
				events[q.ID].cancelled = true
			}
			if batch == 0 {
				if err := s.Raft().Snapshot().Error(); err != nil {
					t.Fatal(err)
				}
			}
		}
		// Cut the power after a random chunk of the next load that reads
		// any: the first loads of the round's events begin within a
		// second.
		at := 1 + rng.IntN(10)
		cut := make(chan struct{})
		var chunks int
		hook := func() {
			if chunks++; chunks == at {
				close(cut)
			}
		}
		cutAfter.Store(&hook)
		select {
		case <-cut:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: no load reached chunk %d", round, at)
		}
		crashed := r.fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
		cutAfter.Store(nil)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := r.st.Close(); err != nil {
			t.Fatal(err)
		}
		r.fs = crashed
		r.st = r.openStore()
		s = r.mustOpen(false)
	}
	defer s.Close()
	want := 0
	for _, e := range events {
		if !e.cancelled {
			want++
		}
	}
	c.WaitIDs(want, 30*time.Second)
	// Duplicates are counted: every one was produced before the replica
	// settled all it took out of its wheel.
	waitAllRead(t, broker.Addrs(), "cut", c, s)
	got := c.Consumed()
	for id, e := range events {
		rec, fired := got.ByID[id]
		switch {
		case e.cancelled && fired:
			t.Errorf("%s was cancelled and fired", id)
		case !e.cancelled && !fired:
			t.Errorf("%s never fired", id)
		case fired && rec.Fired.Before(time.Unix(0, e.due).Truncate(time.Millisecond)):
			t.Errorf("%s fired %v early", id, time.Unix(0, e.due).Sub(rec.Fired))
		}
	}
	t.Logf("%d events, %d fired, %d duplicates", len(events), len(got.ByID), got.Dups)
}

// waitAllRead waits until no record of topic can still come from shards, and
// c has read every one the broker holds: each replica holds no pending
// event, no fire batch and no unanswered produce, and c has read as many
// records of topic as its partitions' end offsets add up to. What a test
// then finds in c is all these replicas produced.
func waitAllRead(t *testing.T, brokers []string, topic string, c *publishtest.Collector, shards ...*Shard) {
	t.Helper()
	waitFor(t, 30*time.Second, "every replica settles what it took out of its wheel", func() bool {
		for _, s := range shards {
			if s.Stats().Pending != 0 {
				return false
			}
			f := s.firing
			f.mu.Lock()
			busy := len(f.inflight) != 0 || len(f.unsure) != 0
			f.mu.Unlock()
			if busy {
				return false
			}
		}
		return true
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, mt)
	mresp, err := meta.RequestWith(ctx, cl)
	if err != nil || len(mresp.Topics) != 1 || mresp.Topics[0].ErrorCode != 0 {
		t.Fatalf("metadata of %s: %v %+v", topic, err, mresp)
	}
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for _, p := range mresp.Topics[0].Partitions {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = p.Partition
		rp.Timestamp = -1 // the end offset
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	var end int64
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			if rp.ErrorCode != 0 {
				t.Fatalf("end offset of %s/%d: error %d", topic, rp.Partition, rp.ErrorCode)
			}
			end += rp.Offset
		}
	}
	waitFor(t, 30*time.Second, fmt.Sprintf("the collector reads all %d records of %s", end, topic), func() bool {
		return int64(len(c.Consumed().Records)) >= end
	})
}
