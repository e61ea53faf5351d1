// Command nats-bench drives NATS JetStream with the official Go client, the way NATS' own
// `nats bench` does: async publish with a bounded in-flight window, file storage, R1, and a pull
// consumer that fetches batches and acknowledges the last message of each (AckAll). It prints one
// JSON object on stdout; bench/_native.py parses it.
//
//	nats-bench -url U -stream S -subject X -mode reset
//	nats-bench -url U -stream S -subject X -mode produce -payload 1024 -duration 2 -warmup 0.5 -window 4096
//	nats-bench -url U -stream S -subject X -mode consume -batch 1000 -duration 2
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/nats-io/nats.go"
)

type produceResult struct {
	Sent    int64   `json:"sent"`
	Acked   int64   `json:"acked"`
	Errors  int64   `json:"errors"`
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"rate"`
	P50Ms   float64 `json:"p50_ms"`
	P99Ms   float64 `json:"p99_ms"`
	P999Ms  float64 `json:"p999_ms"`
	MaxMs   float64 `json:"max_ms"`
	MeanMs  float64 `json:"mean_ms"`
	Samples int     `json:"samples"`
	First   string  `json:"first_error"`
}

type consumeResult struct {
	Received int64   `json:"received"`
	Seconds  float64 `json:"seconds"`
	Rate     float64 `json:"rate"`
}

func main() {
	url := flag.String("url", nats.DefaultURL, "server URL")
	stream := flag.String("stream", "BENCH", "stream name")
	subject := flag.String("subject", "bench", "subject")
	mode := flag.String("mode", "produce", "reset | produce | consume")
	payload := flag.Int("payload", 1024, "message size in bytes")
	duration := flag.Float64("duration", 2, "measured seconds")
	warmup := flag.Float64("warmup", 0.5, "seconds before measuring")
	window := flag.Int("window", 4096, "max async publishes in flight (PublishAsyncMaxPending)")
	batch := flag.Int("batch", 1000, "consumer fetch batch")
	flag.Parse()

	nc, err := nats.Connect(*url, nats.MaxReconnects(0), nats.Timeout(5*time.Second))
	if err != nil {
		fail(err)
	}
	defer nc.Close()
	js, err := nc.JetStream(nats.PublishAsyncMaxPending(*window))
	if err != nil {
		fail(err)
	}
	var out any
	switch *mode {
	case "reset":
		out, err = reset(js, *stream, *subject)
	case "produce":
		out, err = produce(js, *subject, *payload, *window, secs(*warmup), secs(*duration))
	case "consume":
		out, err = consume(js, *stream, *subject, *batch, secs(*duration))
	default:
		err = fmt.Errorf("unknown -mode %q", *mode)
	}
	if err != nil {
		fail(err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail(err)
	}
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func fail(err error) {
	fmt.Fprintln(os.Stderr, "nats-bench:", err)
	os.Exit(1)
}

func reset(js nats.JetStreamContext, stream, subject string) (any, error) {
	if err := js.DeleteStream(stream); err != nil && !errors.Is(err, nats.ErrStreamNotFound) {
		return nil, err
	}
	_, err := js.AddStream(&nats.StreamConfig{
		Name:     stream,
		Subjects: []string{subject},
		Storage:  nats.FileStorage,
		Replicas: 1,
	})
	return map[string]string{"stream": stream}, err
}

type pending struct {
	sent time.Time
	ack  nats.PubAckFuture
}

// produce keeps the window full (PublishAsync blocks at PublishAsyncMaxPending) for warm-up +
// duration. Acks come back in publish order on one stream, so one goroutine waits for each
// future in turn and records publish->ack latency of the messages sent after the warm-up.
func produce(js nats.JetStreamContext, subject string, size, window int, warmup, duration time.Duration) (any, error) {
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		return nil, err
	}
	futures := make(chan pending, window)
	type tally struct {
		acked, errs int64
		lat         []time.Duration
		first       string
		last        time.Time
	}
	done := make(chan tally)
	start := time.Now()
	measureFrom := start.Add(warmup)
	stop := measureFrom.Add(duration)
	go func() {
		var t tally
		for p := range futures {
			select {
			case <-p.ack.Ok():
				if !p.sent.Before(measureFrom) {
					now := time.Now()
					t.acked++
					t.lat = append(t.lat, now.Sub(p.sent))
					t.last = now
				}
			case err := <-p.ack.Err():
				t.errs++
				if t.first == "" {
					t.first = err.Error()
				}
			}
		}
		done <- t
	}()
	var sent int64
	for {
		now := time.Now()
		if !now.Before(stop) {
			break
		}
		f, err := js.PublishAsync(subject, data)
		if err != nil {
			close(futures)
			return nil, err
		}
		if !now.Before(measureFrom) {
			sent++
		}
		futures <- pending{now, f}
	}
	close(futures)
	t := <-done
	seconds := t.last.Sub(measureFrom).Seconds()
	if seconds <= 0 {
		seconds = duration.Seconds()
	}
	r := produceResult{Sent: sent, Acked: t.acked, Errors: t.errs, Seconds: seconds,
		Rate: float64(t.acked) / seconds, Samples: len(t.lat), First: t.first}
	if n := len(t.lat); n > 0 {
		sort.Slice(t.lat, func(i, j int) bool { return t.lat[i] < t.lat[j] })
		q := func(p float64) float64 { return ms(t.lat[min(n-1, int(p*float64(n)))]) }
		var sum time.Duration
		for _, d := range t.lat {
			sum += d
		}
		r.P50Ms, r.P99Ms, r.P999Ms, r.MaxMs = q(0.5), q(0.99), q(0.999), ms(t.lat[n-1])
		r.MeanMs = ms(sum) / float64(n)
	}
	return r, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// consume reads the stream from its start through a new durable pull consumer, fetching up to
// batch messages and acknowledging the last one of each fetch (AckAll), until the stream is
// drained or the duration is up.
func consume(js nats.JetStreamContext, stream, subject string, batch int, duration time.Duration) (any, error) {
	_ = js.DeleteConsumer(stream, "native")
	sub, err := js.PullSubscribe(subject, "native", nats.BindStream(stream), nats.AckAll(),
		nats.DeliverAll(), nats.MaxAckPending(batch*4))
	if err != nil {
		return nil, err
	}
	var received int64
	start := time.Now()
	deadline := start.Add(duration)
	last := start
	for time.Now().Before(deadline) {
		msgs, err := sub.Fetch(batch, nats.MaxWait(time.Second))
		if errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) || len(msgs) == 0 {
			break
		}
		if err != nil {
			return nil, err
		}
		if err := msgs[len(msgs)-1].Ack(); err != nil {
			return nil, err
		}
		received += int64(len(msgs))
		last = time.Now()
	}
	seconds := last.Sub(start).Seconds()
	rate := 0.0
	if seconds > 0 {
		rate = float64(received) / seconds
	}
	return consumeResult{Received: received, Seconds: seconds, Rate: rate}, nil
}
