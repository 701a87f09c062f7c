// Command loadgen drives raw-bytes gRPC calls at one target and prints one JSON result.
//
// Each of -streams goroutines issues calls back to back over one shared connection (as a
// CO does), so "streams" are concurrent HTTP/2 streams. Messages are never decoded: the
// request is sent as given and responses are only counted, so the generator costs little.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/ioutil"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
)

type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	*(v.(*[]byte)) = data
	return nil
}
func (rawCodec) Name() string { return "proto" }

type result struct {
	Calls      int64   `json:"calls"`
	Errors     int64   `json:"errors"`
	FirstError string  `json:"first_error"`
	Seconds    float64 `json:"seconds"`
	Throughput float64 `json:"throughput"`
	Messages   int64   `json:"messages"`
	Bytes      int64   `json:"bytes"`
	MeanUs     float64 `json:"mean_us"`
	P50Us      float64 `json:"p50_us"`
	P99Us      float64 `json:"p99_us"`
	MaxUs      float64 `json:"max_us"`
	Generator  string  `json:"generator"`
}

func main() {
	addr := flag.String("addr", "", "target: unix:///path or host:port")
	method := flag.String("method", "/csi.v1.Identity/GetPluginInfo", "full method path")
	reqFile := flag.String("request", "", "file holding the request message bytes (empty: empty message)")
	streaming := flag.Bool("server-stream", false, "the method is server-streaming")
	streams := flag.Int("streams", 1, "concurrent callers")
	duration := flag.Duration("duration", 0, "measure for this long (or use -calls)")
	calls := flag.Int64("calls", 0, "total calls to measure")
	warmup := flag.Int("warmup", 200, "calls per stream before measuring")
	timeout := flag.Duration("timeout", 60*time.Second, "deadline of each call")
	flag.Parse()

	request := []byte{}
	if *reqFile != "" {
		b, err := ioutil.ReadFile(*reqFile)
		if err != nil {
			fail(err)
		}
		request = b
	}
	target := *addr
	opts := []grpc.DialOption{grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}),
			grpc.MaxCallRecvMsgSize(256<<20), grpc.MaxCallSendMsgSize(256<<20))}
	if strings.HasPrefix(target, "unix://") {
		path := strings.TrimPrefix(target, "unix://")
		opts = append(opts, grpc.WithAuthority("localhost"),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", path)
			}))
		target = "passthrough:///localhost"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	conn, err := grpc.DialContext(ctx, target, opts...)
	cancel()
	if err != nil {
		fail(err)
	}
	defer conn.Close()

	desc := &grpc.StreamDesc{ServerStreams: true}
	one := func() (int64, int64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		defer cancel()
		if !*streaming {
			var resp []byte
			err := conn.Invoke(ctx, *method, &request, &resp)
			return 1, int64(len(resp)), err
		}
		st, err := conn.NewStream(ctx, desc, *method)
		if err != nil {
			return 0, 0, err
		}
		if err := st.SendMsg(&request); err != nil {
			return 0, 0, err
		}
		if err := st.CloseSend(); err != nil {
			return 0, 0, err
		}
		var n, size int64
		for {
			var resp []byte
			if err := st.RecvMsg(&resp); err != nil {
				if err.Error() == "EOF" {
					return n, size, nil
				}
				return n, size, err
			}
			n++
			size += int64(len(resp))
		}
	}

	var wg sync.WaitGroup
	for i := 0; i < *streams; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < *warmup; j++ {
				one()
			}
		}()
	}
	wg.Wait()

	var remaining int64 = *calls
	var stop int32
	lat := make([][]time.Duration, *streams)
	var errs, msgs, size int64
	var firstErr atomic.Value
	start := time.Now()
	if *duration > 0 {
		time.AfterFunc(*duration, func() { atomic.StoreInt32(&stop, 1) })
	}
	for i := 0; i < *streams; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			mine := make([]time.Duration, 0, 4096)
			for atomic.LoadInt32(&stop) == 0 {
				if *duration == 0 && atomic.AddInt64(&remaining, -1) < 0 {
					break
				}
				t0 := time.Now()
				n, b, err := one()
				mine = append(mine, time.Since(t0))
				atomic.AddInt64(&msgs, n)
				atomic.AddInt64(&size, b)
				if err != nil {
					atomic.AddInt64(&errs, 1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
			lat[i] = mine
		}(i)
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()

	all := make([]time.Duration, 0)
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(a, b int) bool { return all[a] < all[b] })
	r := result{Calls: int64(len(all)), Errors: errs, Seconds: elapsed, Messages: msgs, Bytes: size,
		Generator: "go"}
	if v := firstErr.Load(); v != nil {
		r.FirstError = v.(string)
	}
	if len(all) > 0 {
		var sum time.Duration
		for _, d := range all {
			sum += d
		}
		us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
		r.Throughput = float64(len(all)) / elapsed
		r.MeanUs = us(sum) / float64(len(all))
		r.P50Us = us(all[len(all)/2])
		r.P99Us = us(all[(len(all)*99)/100])
		r.MaxUs = us(all[len(all)-1])
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "loadgen:", err)
	os.Exit(1)
}
