// Command segment-bench drives our segment broker from Go over its WebSocket protocol
// (docs/protocol.md), the way bench/nats-go drives NATS: one process that spends little CPU per
// message, so that a step measures the broker and not a Python load generator.
//
// The producer sends what the Python benchmark client sends: one entry per SEND frame, up to
// -batch keyed messages per entry (keys rotate over -keys distinct keys, hashed with murmur3 like
// the SDK), at most -window messages in flight. With -rate 0 it keeps the window full (closed
// loop, latency from the moment a message was queued); with -rate R it generates R messages per
// second on 1 ms ticks (open loop, wrk2 style) and measures from each message's intended send
// time, so a stall anywhere (client, network, broker) counts. The consumer reads a subscription
// from where it stands, walks every message of every entry, acknowledges cumulatively once per
// DELIVER frame and grants permits back as it goes.
//
//	segment-bench -url http://127.0.0.1:8080 -mode produce -payload 100 -rate 500000 -duration 6 -warmup 1.5
//	segment-bench -url http://127.0.0.1:8080 -mode consume -duration 5
//
// It prints one JSON object on stdout; bench/_ours_go.py parses it.
package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/gorilla/websocket"
	"github.com/spaolacci/murmur3"
)

const (
	protocolVersion = 3
	frameHello      = 0x01
	frameHelloOK    = 0x02
	frameSend       = 0x10
	frameSendAck    = 0x11
	frameEntryError = 0x12
	frameSealed     = 0x13
	frameFlow       = 0x20
	frameDeliver    = 0x21
	frameAck        = 0x22
	frameError      = 0x7F

	entryFormat      = 1
	entryHeaderSize  = 34 // <BBHQHHHIQI
	entryKeyed       = 0x01
	entryKeySample   = 0x02
	msgKey           = 0x01
	msgTimestamp     = 0x02
	msgProperties    = 0x04
	ackItemSize      = 17 // <QqB
	deliverItemSize  = 14 // <qHI
	ackCumulative    = 1
	tick             = time.Millisecond
	maxMessageFrames = 128 << 20
)

type options struct {
	url, namespace, topic, subscription, mode string
	tokenFile                                 string
	segment                                   int64
	payload, batch, window, keys, permits     int
	rate, duration, warmup, drain             float64
}

func main() {
	var o options
	flag.StringVar(&o.url, "url", "http://127.0.0.1:8080", "broker base URL (http or https)")
	flag.StringVar(&o.namespace, "namespace", "bench", "topic namespace")
	flag.StringVar(&o.topic, "topic", "t", "topic name")
	flag.Int64Var(&o.segment, "segment", 0, "segment id")
	flag.StringVar(&o.subscription, "subscription", "bench", "subscription (consume)")
	flag.StringVar(&o.mode, "mode", "produce", "produce | consume")
	flag.StringVar(&o.tokenFile, "token-file", "", "file with a bearer token for a broker running --auth kubernetes")
	flag.IntVar(&o.payload, "payload", 1024, "message value size in bytes")
	flag.IntVar(&o.batch, "batch", 256, "messages per entry")
	flag.IntVar(&o.window, "window", 4096, "messages in flight")
	flag.IntVar(&o.keys, "keys", 1024, "distinct keys, used in turn")
	flag.IntVar(&o.permits, "permits", 1000, "consumer permits (entries)")
	flag.Float64Var(&o.rate, "rate", 0, "messages per second; 0 keeps the window full")
	flag.Float64Var(&o.duration, "duration", 5, "seconds generating (warm-up included)")
	flag.Float64Var(&o.warmup, "warmup", 1, "first seconds not measured")
	flag.Float64Var(&o.drain, "drain", 5, "seconds to wait for the last acks")
	flag.Parse()

	var out any
	var err error
	switch o.mode {
	case "produce":
		out, err = produce(o)
	case "consume":
		out, err = consume(o)
	default:
		err = fmt.Errorf("unknown -mode %q", o.mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "segment-bench:", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "segment-bench:", err)
		os.Exit(1)
	}
}

// dial opens a WebSocket to the broker and completes the HELLO handshake.
func dial(o options, path string, hello map[string]any) (*websocket.Conn, map[string]any, error) {
	base := strings.TrimSuffix(o.url, "/")
	switch {
	case strings.HasPrefix(base, "http://"):
		base = "ws://" + base[len("http://"):]
	case strings.HasPrefix(base, "https://"):
		base = "wss://" + base[len("https://"):]
	}
	var header http.Header
	if o.tokenFile != "" {
		token, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return nil, nil, err
		}
		header = http.Header{"Authorization": {"Bearer " + strings.TrimSpace(string(token))}}
	}
	dialer := websocket.Dialer{HandshakeTimeout: 10 * time.Second, ReadBufferSize: 1 << 20, WriteBufferSize: 1 << 20}
	conn, resp, err := dialer.Dial(base+path, header)
	if err != nil {
		if resp != nil {
			return nil, nil, fmt.Errorf("connect %s: %w (HTTP %d)", path, err, resp.StatusCode)
		}
		return nil, nil, fmt.Errorf("connect %s: %w", path, err)
	}
	conn.SetReadLimit(maxMessageFrames)
	body, err := json.Marshal(hello)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	frame := append([]byte{frameHello, protocolVersion & 0xFF, protocolVersion >> 8}, body...)
	if err := conn.WriteMessage(websocket.BinaryMessage, frame); err != nil {
		conn.Close()
		return nil, nil, err
	}
	_, data, err := conn.ReadMessage()
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("handshake: %w", err)
	}
	if len(data) >= 3 && data[0] == frameHelloOK {
		var ok map[string]any
		if err := json.Unmarshal(data[3:], &ok); err != nil {
			conn.Close()
			return nil, nil, fmt.Errorf("HELLO_OK: %w", err)
		}
		return conn, ok, nil
	}
	conn.Close()
	return nil, nil, fmt.Errorf("handshake refused: %s", frameText(data))
}

func frameText(data []byte) string {
	if len(data) > 0 && (data[0] == frameError || data[0] == frameEntryError || data[0] == frameSealed) {
		return string(data[1:])
	}
	return fmt.Sprintf("unexpected frame of %d bytes", len(data))
}

// --- produce -------------------------------------------------------------------------------------

type portion struct {
	count    int
	intended time.Duration // since the step's start
}

type batch struct {
	seq      uint64
	count    int
	portions []portion
}

type sample struct {
	micros int64
	count  int
}

type produceResult struct {
	Offered    float64 `json:"offered"`
	Sent       int64   `json:"sent"`
	Acked      int64   `json:"acked"`
	Errors     int64   `json:"errors"`
	Unfinished int64   `json:"unfinished"`
	Seconds    float64 `json:"seconds"`
	Rate       float64 `json:"rate"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	P999Ms     float64 `json:"p999_ms"`
	MaxMs      float64 `json:"max_ms"`
	MeanMs     float64 `json:"mean_ms"`
	Samples    int64   `json:"samples"`
	LagP99Ms   float64 `json:"gen_lag_p99_ms"`
	LagMaxMs   float64 `json:"gen_lag_max_ms"`
	First      string  `json:"first_error"`
}

type readEvent struct {
	acks  []uint64 // sequence ids, in send order
	fatal error
	entry string // an ENTRY_ERROR's text
}

// encoder builds entries of keyed messages, keys in turn, like bench/_ours.py's producer.
type encoder struct {
	name     []byte
	keys     [][]byte
	hashes   []uint32
	value    []byte
	next     int
	sequence uint64
}

func newEncoder(name string, keys, payload int) *encoder {
	e := &encoder{name: []byte(name), value: make([]byte, payload)}
	for i := range e.value {
		e.value[i] = byte(i*131 + 7)
	}
	for i := 0; i < keys; i++ {
		k := []byte(fmt.Sprintf("key-%d", i))
		e.keys = append(e.keys, k)
		e.hashes = append(e.hashes, murmur3.Sum32(k))
	}
	return e
}

// sendFrame is one SEND frame holding one entry of n messages; it returns the entry's sequence id.
func (e *encoder) sendFrame(n int) ([]byte, uint64) {
	size := 3 + 4 + entryHeaderSize + len(e.name)
	for i := 0; i < n; i++ {
		size += 7 + len(e.keys[(e.next+i)%len(e.keys)]) + len(e.value)
	}
	f := make([]byte, size)
	f[0] = frameSend
	binary.LittleEndian.PutUint16(f[1:], 1)
	binary.LittleEndian.PutUint32(f[3:], uint32(size-7))
	h := f[7:]
	off := entryHeaderSize + len(e.name)
	copy(h[entryHeaderSize:], e.name)
	var hmin, hmax uint32 = 0xFFFF, 0
	sample := e.hashes[e.next%len(e.keys)] >> 16
	p := off
	for i := 0; i < n; i++ {
		k := (e.next + i) % len(e.keys)
		hb := e.hashes[k] & 0xFFFF
		hmin, hmax = min(hmin, hb), max(hmax, hb)
		key := e.keys[k]
		h[p] = msgKey
		binary.LittleEndian.PutUint16(h[p+1:], uint16(len(key)))
		binary.LittleEndian.PutUint32(h[p+3:], uint32(len(e.value)))
		p += 7
		p += copy(h[p:], key)
		p += copy(h[p:], e.value)
	}
	e.next = (e.next + n) % len(e.keys)
	e.sequence++
	h[0] = entryFormat
	h[1] = entryKeyed | entryKeySample
	binary.LittleEndian.PutUint16(h[2:], uint16(len(e.name)))
	binary.LittleEndian.PutUint64(h[4:], e.sequence)
	binary.LittleEndian.PutUint16(h[12:], uint16(hmin))
	binary.LittleEndian.PutUint16(h[14:], uint16(hmax))
	binary.LittleEndian.PutUint16(h[16:], uint16(sample))
	binary.LittleEndian.PutUint32(h[18:], uint32(n))
	binary.LittleEndian.PutUint64(h[22:], uint64(time.Now().UnixMilli()))
	binary.LittleEndian.PutUint32(h[30:], uint32(p-off))
	return f, e.sequence
}

// readAcks turns the broker's frames into events for the producer loop until the connection ends.
func readAcks(conn *websocket.Conn, events chan<- readEvent) {
	for {
		_, data, err := conn.ReadMessage()
		if err != nil {
			events <- readEvent{fatal: err}
			return
		}
		if len(data) == 0 {
			events <- readEvent{fatal: errors.New("empty frame")}
			return
		}
		switch data[0] {
		case frameSendAck:
			if len(data) < 3 {
				events <- readEvent{fatal: errors.New("short SEND_ACK")}
				return
			}
			n := int(binary.LittleEndian.Uint16(data[1:]))
			if len(data) != 3+n*ackItemSize {
				events <- readEvent{fatal: errors.New("SEND_ACK of the wrong length")}
				return
			}
			acks := make([]uint64, n)
			for i := range acks {
				acks[i] = binary.LittleEndian.Uint64(data[3+i*ackItemSize:])
			}
			events <- readEvent{acks: acks}
		case frameEntryError:
			events <- readEvent{entry: string(data[1:])}
		default:
			events <- readEvent{fatal: fmt.Errorf("broker: %s", frameText(data))}
			return
		}
	}
}

type producer struct {
	o          options
	conn       *websocket.Conn
	enc        *encoder
	start      time.Time
	measure    time.Duration
	end        time.Duration
	queue      []portion
	queued     int
	inflight   int
	batches    []batch
	sent       int64
	acked      int64
	ackedIn    int64
	errors     int64
	first      string
	samples    []sample
	generating bool
}

func (p *producer) now() time.Duration { return time.Since(p.start) }

func (p *producer) record(portions []portion, at time.Duration) {
	for _, q := range portions {
		if q.intended >= p.measure {
			p.samples = append(p.samples, sample{max(1, (at - q.intended).Microseconds()), q.count})
		}
	}
}

func (p *producer) dispatch() error {
	if p.o.rate == 0 && p.generating {
		if free := p.o.window - p.inflight - p.queued; free > 0 {
			p.queue = append(p.queue, portion{free, p.now()})
			p.queued += free
		}
	}
	for p.queued > 0 {
		n := min(p.o.batch, p.queued)
		if p.inflight+n > p.o.window {
			return nil
		}
		var portions []portion
		for need := n; need > 0; {
			take := min(need, p.queue[0].count)
			portions = append(portions, portion{take, p.queue[0].intended})
			p.queue[0].count -= take
			need -= take
			if p.queue[0].count == 0 {
				p.queue = p.queue[1:]
			}
		}
		frame, seq := p.enc.sendFrame(n)
		if err := p.conn.WriteMessage(websocket.BinaryMessage, frame); err != nil {
			return err
		}
		p.queued -= n
		p.inflight += n
		p.sent += int64(n)
		p.batches = append(p.batches, batch{seq, n, portions})
	}
	return nil
}

func (p *producer) onAcks(seqs []uint64) error {
	at := p.now()
	for _, seq := range seqs {
		if len(p.batches) == 0 || p.batches[0].seq != seq {
			return fmt.Errorf("ack for sequence id %d out of order", seq)
		}
		b := p.batches[0]
		p.batches = p.batches[1:]
		p.inflight -= b.count
		p.acked += int64(b.count)
		if at >= p.measure && at <= p.end {
			p.ackedIn += int64(b.count)
		}
		p.record(b.portions, at)
	}
	return p.dispatch()
}

func produce(o options) (any, error) {
	name := fmt.Sprintf("bench-go-%d-%d", os.Getpid(), time.Now().UnixNano())
	path := fmt.Sprintf("/ws/v1/produce/%s/%s/%d", o.namespace, o.topic, o.segment)
	conn, _, err := dial(o, path, map[string]any{"producerName": name})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	events := make(chan readEvent, o.window+16)
	go readAcks(conn, events)

	p := &producer{o: o, conn: conn, enc: newEncoder(name, o.keys, o.payload), generating: true}
	p.start = time.Now().Add(10 * time.Millisecond)
	p.measure = secs(o.warmup)
	p.end = secs(o.duration)
	total := int(o.duration * o.rate)
	generated := 0
	var lags []int64
	lagMax := time.Duration(0)
	timer := time.NewTimer(time.Until(p.start))
	next := time.Duration(0)
	var fatal error
loop:
	for {
		select {
		case ev := <-events:
			if err := p.onEvent(ev); err != nil {
				fatal = err
				break loop
			}
		case <-timer.C:
			now := p.now()
			lag := now - next
			lagMax = max(lagMax, lag)
			if now >= p.measure {
				lags = append(lags, max(1, lag.Microseconds()))
			}
			// A tick that fires after the end still generates what was due before it: a
			// stall near the end must show in the latencies, not shorten the run.
			if o.rate > 0 {
				due := min(total, int(now.Seconds()*o.rate))
				if k := due - generated; k > 0 {
					mid := secs((float64(generated) + float64(k-1)/2) / o.rate)
					p.queue = append(p.queue, portion{k, mid})
					p.queued += k
					generated = due
				}
			}
			if err := p.dispatch(); err != nil {
				fatal = err
				break loop
			}
			if now >= p.end {
				break loop
			}
			next += tick
			if next < now {
				next = (now/tick + 1) * tick
			}
			timer.Reset(time.Until(p.start.Add(next)))
		}
	}
	p.generating = false
	if o.rate == 0 {
		p.queue, p.queued = nil, 0
	}
	deadline := time.After(secs(o.drain))
drain:
	for fatal == nil && (p.inflight > 0 || p.queued > 0) {
		select {
		case ev := <-events:
			if err := p.onEvent(ev); err != nil {
				fatal = err
			}
		case <-deadline:
			break drain
		}
	}
	// What is still queued or unacknowledged is recorded with its wait so far (a lower bound).
	at := p.now()
	p.record(p.queue, at)
	for _, b := range p.batches {
		p.record(b.portions, at)
	}
	if fatal != nil && p.first == "" {
		p.first = fatal.Error()
	}
	measured := o.duration - o.warmup
	r := produceResult{Offered: o.rate, Sent: p.sent, Acked: p.acked, Errors: p.errors,
		Unfinished: int64(p.queued + p.inflight), Seconds: measured, First: p.first}
	if measured > 0 {
		r.Rate = float64(p.ackedIn) / measured
	}
	r.P50Ms, r.P99Ms, r.P999Ms, r.MaxMs, r.MeanMs, r.Samples = summarize(p.samples)
	r.LagMaxMs = ms(lagMax)
	if len(lags) > 0 {
		sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
		r.LagP99Ms = float64(lags[min(len(lags)-1, int(0.99*float64(len(lags))))]) / 1000
	}
	return r, nil
}

func (p *producer) onEvent(ev readEvent) error {
	switch {
	case ev.fatal != nil:
		return ev.fatal
	case ev.entry != "":
		// A refused entry is not acknowledged; nothing of this benchmark's entries should be.
		p.errors++
		if p.first == "" {
			p.first = ev.entry
		}
		return fmt.Errorf("entry refused: %s", ev.entry)
	default:
		return p.onAcks(ev.acks)
	}
}

// summarize gives p50, p99, p99.9, max and mean in milliseconds of count-weighted samples.
func summarize(samples []sample) (p50, p99, p999, maxMs, mean float64, n int64) {
	if len(samples) == 0 {
		return
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i].micros < samples[j].micros })
	var sum float64
	for _, s := range samples {
		n += int64(s.count)
		sum += float64(s.micros) * float64(s.count)
	}
	at := func(q float64) float64 {
		rank := int64(math.Ceil(q * float64(n)))
		var seen int64
		for _, s := range samples {
			seen += int64(s.count)
			if seen >= rank {
				return float64(s.micros) / 1000
			}
		}
		return float64(samples[len(samples)-1].micros) / 1000
	}
	return at(0.5), at(0.99), at(0.999), float64(samples[len(samples)-1].micros) / 1000, sum / float64(n) / 1000, n
}

// --- consume -------------------------------------------------------------------------------------

type consumeResult struct {
	Received int64   `json:"received"`
	Entries  int64   `json:"entries"`
	Seconds  float64 `json:"seconds"`
	Rate     float64 `json:"rate"`
}

// messagesIn walks every message of an entry (header, key, value, timestamp, properties) and
// returns how many it holds: what an application's decode loop does, without copying.
func messagesIn(entry []byte) (int, error) {
	if len(entry) < entryHeaderSize || entry[0] != entryFormat {
		return 0, errors.New("bad entry header")
	}
	nameLen := int(binary.LittleEndian.Uint16(entry[2:]))
	count := int(binary.LittleEndian.Uint32(entry[18:]))
	plen := int(binary.LittleEndian.Uint32(entry[30:]))
	p := entryHeaderSize + nameLen
	end := p + plen
	if end != len(entry) {
		return 0, errors.New("entry lengths do not add up")
	}
	for i := 0; i < count; i++ {
		if p+7 > end {
			return 0, errors.New("message header runs past the entry")
		}
		flags := entry[p]
		p += 7 + int(binary.LittleEndian.Uint16(entry[p+1:])) + int(binary.LittleEndian.Uint32(entry[p+3:]))
		if flags&msgTimestamp != 0 {
			p += 8
		}
		if flags&msgProperties != 0 {
			if p+2 > end {
				return 0, errors.New("properties run past the entry")
			}
			props := int(binary.LittleEndian.Uint16(entry[p:]))
			p += 2
			for j := 0; j < props && p <= end; j++ {
				p += 2 + int(binary.LittleEndian.Uint16(entry[p:]))
				p += 4 + int(binary.LittleEndian.Uint32(entry[p:]))
			}
		}
		if p > end {
			return 0, errors.New("message runs past the entry")
		}
	}
	return count, nil
}

func consume(o options) (any, error) {
	path := fmt.Sprintf("/ws/v1/consume/%s/%s/%d/%s", o.namespace, o.topic, o.segment, o.subscription)
	hello := map[string]any{"consumerName": "go-consumer", "buckets": nil, "permits": o.permits}
	conn, _, err := dial(o, path, hello)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var received, entries int64
	start := time.Now()
	deadline := start.Add(secs(o.duration))
	last := start
	taken := 0
	for time.Now().Before(deadline) {
		// An idle second ends the read: everything written before it was delivered.
		_ = conn.SetReadDeadline(time.Now().Add(time.Second))
		_, data, err := conn.ReadMessage()
		if err != nil {
			var ne interface{ Timeout() bool }
			if errors.As(err, &ne) && ne.Timeout() {
				break
			}
			return nil, err
		}
		if len(data) == 0 || data[0] != frameDeliver {
			if len(data) > 0 && data[0] == frameError {
				return nil, fmt.Errorf("broker: %s", frameText(data))
			}
			continue // END_OF_SEGMENT and the like: nothing to count
		}
		if len(data) < 3 {
			return nil, errors.New("short DELIVER")
		}
		n := int(binary.LittleEndian.Uint16(data[1:]))
		off := 3
		lastPos := int64(-1)
		for i := 0; i < n; i++ {
			if off+deliverItemSize > len(data) {
				return nil, errors.New("DELIVER truncated")
			}
			lastPos = int64(binary.LittleEndian.Uint64(data[off:]))
			length := int(binary.LittleEndian.Uint32(data[off+10:]))
			off += deliverItemSize
			if off+length > len(data) {
				return nil, errors.New("DELIVER entry runs past the frame")
			}
			count, err := messagesIn(data[off : off+length])
			if err != nil {
				return nil, fmt.Errorf("position %d: %w", lastPos, err)
			}
			received += int64(count)
			off += length
		}
		entries += int64(n)
		last = time.Now()
		ack := make([]byte, 12)
		ack[0], ack[1] = frameAck, ackCumulative
		binary.LittleEndian.PutUint16(ack[2:], 1)
		binary.LittleEndian.PutUint64(ack[4:], uint64(lastPos))
		if err := conn.WriteMessage(websocket.BinaryMessage, ack); err != nil {
			return nil, err
		}
		taken += n
		if taken*2 >= o.permits {
			flow := make([]byte, 5)
			flow[0] = frameFlow
			binary.LittleEndian.PutUint32(flow[1:], uint32(taken))
			if err := conn.WriteMessage(websocket.BinaryMessage, flow); err != nil {
				return nil, err
			}
			taken = 0
		}
	}
	seconds := last.Sub(start).Seconds()
	r := consumeResult{Received: received, Entries: entries, Seconds: seconds}
	if seconds > 0 {
		r.Rate = float64(received) / seconds
	}
	return r, nil
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
