// Command scaler-client speaks to an External Scaler the way KEDA does: grpc-go, KEDA's own
// generated stubs, one client connection per scaler address with every stream and call on it,
// and KEDA's service config (round_robin). It opens a burst of StreamIsActive streams while
// unary calls flow, and prints what it saw as one JSON object on standard output.
//
// The unary calls go out open-loop at -rate per second, alternately GetMetrics and IsActive,
// on the streams' own connection and, with -probe-rate, on a second connection of their own
// (the second shows what the server adds, the first also what the streams' headers ahead of
// a call cost). After -warmup the -streams streams open at once; the client then waits until
// every stream has its first message (or -first-timeout passes), keeps everything open for
// -hold, and ends every call.
//
// Usage:
//
//	scaler-client -address 127.0.0.1:6000 -metadata '[{"profile":"training"}]' \
//	    -streams 1000 -rate 200 -probe-rate 20 -warmup 1s -hold 5s
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"sync"
	"time"

	pb "github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// kedaServiceConfig is the service config KEDA's external scaler dials with
// (pkg/scalers/external_scaler.go, grpcConfig).
const kedaServiceConfig = `{"loadBalancingConfig": [{"round_robin":{}}]}`

type options struct {
	address      string
	metadata     []map[string]string
	namespace    string
	streams      int
	rate         float64
	probeRate    float64
	warmup       time.Duration
	hold         time.Duration
	firstTimeout time.Duration
	callTimeout  time.Duration
}

// call is one unary call: when it was sent (seconds since the client started), how long it
// took, and the gRPC status code it ended with.
type call struct {
	SentS     float64 `json:"sent_s"`
	LatencyMs float64 `json:"latency_ms"`
	Code      string  `json:"code"`
}

// summary is a latency distribution; with no sample its figures are null.
type summary struct {
	Count int      `json:"count"`
	P50Ms *float64 `json:"p50_ms"`
	P99Ms *float64 `json:"p99_ms"`
	MaxMs *float64 `json:"max_ms"`
}

type report struct {
	Client          string            `json:"client"`
	Address         string            `json:"address"`
	Streams         int               `json:"streams"`
	BurstAtS        float64           `json:"burst_at_s"`
	AllFirstS       float64           `json:"all_first_s"`
	FirstMessage    summary           `json:"first_message"`
	StreamsAnswered int               `json:"streams_answered"`
	StreamMessages  int               `json:"stream_messages"`
	StreamErrors    map[string]int    `json:"stream_errors"`
	StreamsActive   int               `json:"streams_active_last"`
	Unary           []call            `json:"unary"`
	Probe           []call            `json:"probe"`
	UnaryBefore     summary           `json:"unary_before_burst"`
	UnaryDuring     summary           `json:"unary_during_burst"`
	ProbeDuring     summary           `json:"probe_during_burst"`
	Errors          map[string]string `json:"errors,omitempty"`
}

func main() {
	opts, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "scaler-client: %v\n", err)
		os.Exit(2)
	}
	out, err := run(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "scaler-client: %v\n", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "scaler-client: %v\n", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (options, error) {
	var o options
	var metadata string
	fs := flag.NewFlagSet("scaler-client", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.address, "address", "127.0.0.1:6000", "the scaler's gRPC address")
	fs.StringVar(&metadata, "metadata", `[{"profile":"training"}]`, "a JSON list of trigger metadata maps, used in turn")
	fs.StringVar(&o.namespace, "namespace", "default", "the ScaledObjects' namespace")
	fs.IntVar(&o.streams, "streams", 1000, "StreamIsActive streams opened at once")
	fs.Float64Var(&o.rate, "rate", 200, "unary calls per second on the streams' connection")
	fs.Float64Var(&o.probeRate, "probe-rate", 20, "unary calls per second on a second connection (0: none)")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unary calls before the burst")
	fs.DurationVar(&o.hold, "hold", 5*time.Second, "how long everything stays open after every stream answered")
	fs.DurationVar(&o.firstTimeout, "first-timeout", 60*time.Second, "how long to wait for every stream's first message")
	fs.DurationVar(&o.callTimeout, "call-timeout", 5*time.Second, "deadline of each unary call")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if err := json.Unmarshal([]byte(metadata), &o.metadata); err != nil || len(o.metadata) == 0 {
		return o, fmt.Errorf("-metadata %q: a non-empty JSON list of string maps is needed", metadata)
	}
	if o.streams < 0 || o.rate < 0 || o.probeRate < 0 {
		return o, errors.New("-streams, -rate and -probe-rate cannot be negative")
	}
	return o, nil
}

func dial(address string) (*grpc.ClientConn, error) {
	return grpc.NewClient(address,
		grpc.WithDefaultServiceConfig(kedaServiceConfig),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func run(o options) (*report, error) {
	conn, err := dial(o.address)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	probeConn, err := dial(o.address)
	if err != nil {
		return nil, err
	}
	defer probeConn.Close()
	client := pb.NewExternalScalerClient(conn)
	refs := objectRefs(o)
	metricNames, err := metricNamesOf(client, refs, len(o.metadata), o.callTimeout)
	if err != nil {
		return nil, err
	}

	start := time.Now()
	since := func() float64 { return time.Since(start).Seconds() }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	unary := newCalls()
	probe := newCalls()
	var loops sync.WaitGroup
	loops.Add(2)
	go func() { defer loops.Done(); callLoop(ctx, client, refs, metricNames, o, o.rate, unary, since) }()
	go func() {
		defer loops.Done()
		callLoop(ctx, pb.NewExternalScalerClient(probeConn), refs, metricNames, o, o.probeRate, probe, since)
	}()

	time.Sleep(o.warmup)
	out := &report{Client: "grpc-go", Address: o.address, Streams: o.streams, StreamErrors: map[string]int{}}
	out.BurstAtS = since()
	burst := openStreams(ctx, client, refs, o.streams, since)
	allFirst := burst.waitAllFirst(o.firstTimeout)
	out.AllFirstS = allFirst - out.BurstAtS
	time.Sleep(o.hold)
	cancel()
	loops.Wait()
	burst.wait()

	burst.fill(out)
	out.Unary = unary.all()
	out.Probe = probe.all()
	during := func(c call) bool { return c.SentS >= out.BurstAtS && c.SentS <= allFirst+1 }
	out.UnaryBefore = summarize(out.Unary, func(c call) bool { return c.SentS < out.BurstAtS })
	out.UnaryDuring = summarize(out.Unary, during)
	out.ProbeDuring = summarize(out.Probe, during)
	return out, nil
}

func objectRefs(o options) []*pb.ScaledObjectRef {
	refs := make([]*pb.ScaledObjectRef, 0, max(o.streams, len(o.metadata)))
	for i := 0; i < max(o.streams, len(o.metadata)); i++ {
		refs = append(refs, &pb.ScaledObjectRef{
			Name:           fmt.Sprintf("scaledobject-%d", i),
			Namespace:      o.namespace,
			ScalerMetadata: o.metadata[i%len(o.metadata)],
		})
	}
	return refs
}

// metricNamesOf asks GetMetricSpec once per metadata map, as KEDA does before it polls.
func metricNamesOf(client pb.ExternalScalerClient, refs []*pb.ScaledObjectRef, maps int, timeout time.Duration) ([]string, error) {
	names := make([]string, maps)
	for i := range names {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		spec, err := client.GetMetricSpec(ctx, refs[i])
		cancel()
		if err != nil {
			return nil, fmt.Errorf("GetMetricSpec for %v: %w", refs[i].ScalerMetadata, err)
		}
		if len(spec.MetricSpecs) == 0 {
			return nil, fmt.Errorf("GetMetricSpec for %v: no metric spec", refs[i].ScalerMetadata)
		}
		names[i] = spec.MetricSpecs[0].MetricName
	}
	return names, nil
}

type calls struct {
	mu   sync.Mutex
	list []call
}

func newCalls() *calls { return &calls{} }

func (c *calls) add(one call) {
	c.mu.Lock()
	c.list = append(c.list, one)
	c.mu.Unlock()
}

func (c *calls) all() []call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]call(nil), c.list...)
}

// callLoop sends calls open-loop: each at its own time on the rate's grid, each in a
// goroutine of its own, so a slow answer never delays the next call.
func callLoop(ctx context.Context, client pb.ExternalScalerClient, refs []*pb.ScaledObjectRef,
	names []string, o options, rate float64, into *calls, since func() float64) {
	if rate <= 0 {
		return
	}
	period := time.Duration(float64(time.Second) / rate)
	ticker := time.NewTicker(period)
	defer ticker.Stop()
	var inflight sync.WaitGroup
	defer inflight.Wait()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		i := n % len(refs)
		inflight.Add(1)
		go func(n, i int) {
			defer inflight.Done()
			into.add(oneCall(client, refs[i], names[i%len(names)], n%2 == 0, o.callTimeout, since))
		}(n, i)
	}
}

func oneCall(client pb.ExternalScalerClient, ref *pb.ScaledObjectRef, metricName string,
	getMetrics bool, timeout time.Duration, since func() float64) call {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	sent := since()
	began := time.Now()
	var err error
	if getMetrics {
		_, err = client.GetMetrics(ctx, &pb.GetMetricsRequest{ScaledObjectRef: ref, MetricName: metricName})
	} else {
		_, err = client.IsActive(ctx, ref)
	}
	return call{
		SentS:     sent,
		LatencyMs: float64(time.Since(began).Microseconds()) / 1000,
		Code:      status.Code(err).String(),
	}
}

type streamState struct {
	firstS   float64
	messages int
	active   bool
	err      string
}

type burst struct {
	mu       sync.Mutex
	states   []streamState
	answered int
	allFirst chan struct{}
	done     sync.WaitGroup
	since    func() float64
}

func openStreams(ctx context.Context, client pb.ExternalScalerClient, refs []*pb.ScaledObjectRef,
	n int, since func() float64) *burst {
	b := &burst{states: make([]streamState, n), allFirst: make(chan struct{}), since: since}
	if n == 0 {
		close(b.allFirst)
	}
	for i := 0; i < n; i++ {
		b.done.Add(1)
		go b.follow(ctx, client, refs[i], i)
	}
	return b
}

func (b *burst) follow(ctx context.Context, client pb.ExternalScalerClient, ref *pb.ScaledObjectRef, i int) {
	defer b.done.Done()
	stream, err := client.StreamIsActive(ctx, ref)
	if err != nil {
		b.fail(i, err)
		return
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			b.fail(i, err)
			return
		}
		b.receive(i, msg.Result)
	}
}

func (b *burst) receive(i int, active bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := &b.states[i]
	if s.messages == 0 {
		s.firstS = b.since()
		b.answered++
		if b.answered == len(b.states) {
			close(b.allFirst)
		}
	}
	s.messages++
	s.active = active
}

func (b *burst) fail(i int, err error) {
	if errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.states[i].err = status.Code(err).String()
}

// waitAllFirst returns when every stream has had its first message, or at the timeout.
func (b *burst) waitAllFirst(timeout time.Duration) float64 {
	select {
	case <-b.allFirst:
	case <-time.After(timeout):
	}
	return b.since()
}

func (b *burst) wait() { b.done.Wait() }

func (b *burst) fill(out *report) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var firsts []float64
	for _, s := range b.states {
		out.StreamMessages += s.messages
		if s.messages > 0 {
			firsts = append(firsts, (s.firstS-out.BurstAtS)*1000)
			out.StreamsAnswered++
		}
		if s.active {
			out.StreamsActive++
		}
		if s.err != "" {
			out.StreamErrors[s.err]++
		}
	}
	out.FirstMessage = summaryOf(firsts)
}

func summarize(list []call, keep func(call) bool) summary {
	var ms []float64
	for _, c := range list {
		if keep(c) && c.Code == "OK" {
			ms = append(ms, c.LatencyMs)
		}
	}
	return summaryOf(ms)
}

func summaryOf(ms []float64) summary {
	if len(ms) == 0 {
		return summary{}
	}
	sort.Float64s(ms)
	at := func(q float64) *float64 { v := ms[int(math.Ceil(q*float64(len(ms))))-1]; return &v }
	return summary{Count: len(ms), P50Ms: at(0.50), P99Ms: at(0.99), MaxMs: at(1)}
}
