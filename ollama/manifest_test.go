package ollama

import (
	"path/filepath"
	"strings"
	"testing"
)

func FuzzManifest(f *testing.F) {
	f.Add([]byte(`{"schemaVersion":2,"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:` + strings.Repeat("0", 64) + `","size":5}]}`))
	f.Add([]byte(`{"schemaVersion":2,"layers":[{"digest":"sha256:../../etc/passwd"}]}`))
	f.Add([]byte(`{"schemaVersion":2,"config":{"digest":"sha256-` + strings.Repeat("a", 64) + `","size":-1}}`))
	s := Store{Dir: "/store"}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseManifest(data)
		if err != nil {
			return
		}
		for _, l := range append(m.Layers, m.Config) {
			if l.Digest == "" {
				continue
			}
			p, err := s.BlobPath(l.Digest)
			if err != nil || filepath.Dir(p) != "/store/blobs" {
				t.Errorf("an accepted manifest names blob %q: %s, %v", l.Digest, p, err)
			}
		}
	})
}
