// Command testhub serves kiln's test hub (package hubtest) until
// interrupted, so that kiln pull and huggingface_hub can be tried without
// the internet:
//
//	go run ./internal/hubtest/testhub -addr 127.0.0.1:8765 &
//	HF_ENDPOINT=http://127.0.0.1:8765 kiln pull kiln-test/demo
//
// It serves kiln-test/demo (kiln's demo model), kiln-test/tiny-qwen3 and
// kiln-test/qwen3-w256-GGUF (Q4_K_M, Q5_K_M and Q8_0 files), and a gated
// copy of the demo, kiln-test/gated-demo, which wants the token it prints.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"

	"github.com/kiln-llm/kiln/internal/hubtest"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8765", "address of the hub (the CDN takes a free port)")
	rate := flag.Int64("rate", 0, "bytes a second each download is limited to (0: no limit), to watch progress")
	flag.Parse()
	repos, err := hubtest.Models()
	if err != nil {
		log.Fatal(err)
	}
	gated := *repos[0]
	gated.ID, gated.Gated = "kiln-test/gated-demo", true
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	h := hubtest.NewOn(l, nil, append(repos, &gated)...)
	defer h.Close()
	h.Rate = *rate
	fmt.Printf("test hub at %s (CDN %s); token for gated repositories: %s\n", h.URL(), h.CDN.URL, h.Token)
	for _, r := range append(repos, &gated) {
		fmt.Printf("  %s @ %s\n", r.ID, r.Commit())
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt)
	<-stop
}
