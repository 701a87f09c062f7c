// Command mockplugin is a fast raw-bytes gRPC plugin for benchmarks.
//
// It answers every method listed in a JSON table with bytes prepared beforehand:
// {"/pkg.Svc/Method": {"file": "resp.bin", "stream": false}, ...}. A unary method answers
// the file's bytes; a streaming one sends the file's messages, each prefixed by a 4-byte
// big-endian length. Unknown methods get UNIMPLEMENTED. Requests are read and ignored.
package main

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io/ioutil"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	*(v.(*[]byte)) = data
	return nil
}
func (rawCodec) Name() string   { return "proto" }
func (rawCodec) String() string { return "proto" }

type entry struct {
	File   string `json:"file"`
	Stream bool   `json:"stream"`
}

func main() {
	listen := flag.String("listen", "", "UNIX socket path")
	table := flag.String("table", "", "JSON table of method -> response file")
	flag.Parse()

	raw, err := ioutil.ReadFile(*table)
	if err != nil {
		fail(err)
	}
	var entries map[string]entry
	if err := json.Unmarshal(raw, &entries); err != nil {
		fail(err)
	}
	unary := map[string][]byte{}
	streams := map[string][][]byte{}
	for method, e := range entries {
		path := e.File
		if !filepath.IsAbs(path) {
			path = filepath.Join(filepath.Dir(*table), path)
		}
		b, err := ioutil.ReadFile(path)
		if err != nil {
			fail(err)
		}
		if !e.Stream {
			unary[method] = b
			continue
		}
		var msgs [][]byte
		for len(b) >= 4 {
			n := binary.BigEndian.Uint32(b)
			msgs = append(msgs, b[4:4+n])
			b = b[4+n:]
		}
		streams[method] = msgs
	}

	handler := func(_ interface{}, st grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(st)
		var req []byte
		if err := st.RecvMsg(&req); err != nil {
			return err
		}
		if resp, ok := unary[method]; ok {
			return st.SendMsg(&resp)
		}
		if msgs, ok := streams[method]; ok {
			for i := range msgs {
				if err := st.SendMsg(&msgs[i]); err != nil {
					return err
				}
			}
			return nil
		}
		return status.Errorf(codes.Unimplemented, "mockplugin: no answer for %s", method)
	}

	os.Remove(*listen)
	lis, err := net.Listen("unix", *listen)
	if err != nil {
		fail(err)
	}
	srv := grpc.NewServer(grpc.CustomCodec(rawCodec{}), grpc.UnknownServiceHandler(handler),
		grpc.MaxRecvMsgSize(256<<20), grpc.MaxSendMsgSize(256<<20))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		srv.Stop()
	}()
	if err := srv.Serve(lis); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "mockplugin:", err)
	os.Exit(1)
}
