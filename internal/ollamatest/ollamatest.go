// Package ollamatest lays models out in a directory as `ollama pull` lays
// them out in ~/.ollama/models, for tests of what reads Ollama's store.
package ollamatest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/kiln-llm/kiln/ollama"
)

// Add stores gguf as the model name in the store at dir: the GGUF file,
// a template, parameters, a licence and the config as blobs/sha256-HEX,
// and the manifest that lists them at manifests/HOST/NAMESPACE/MODEL/TAG.
// It returns the GGUF's blob path.
func Add(dir, name string, gguf []byte) (string, error) {
	n, err := ollama.ParseName(name)
	if err != nil {
		return "", err
	}
	blob := func(data []byte, mediaType string) (ollama.Layer, error) {
		sum := sha256.Sum256(data)
		l := ollama.Layer{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(data))}
		p := filepath.Join(dir, "blobs", "sha256-"+hex.EncodeToString(sum[:]))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return l, err
		}
		return l, os.WriteFile(p, data, 0o644)
	}
	var layers []ollama.Layer
	for _, l := range []struct {
		data      []byte
		mediaType string
	}{
		{gguf, ollama.ModelMediaType},
		{[]byte("{{ .Prompt }}"), "application/vnd.ollama.image.template"},
		{[]byte(`{"temperature":0.6,"top_k":20}`), "application/vnd.ollama.image.params"},
		{[]byte("Apache License 2.0"), "application/vnd.ollama.image.license"},
	} {
		layer, err := blob(l.data, l.mediaType)
		if err != nil {
			return "", err
		}
		layers = append(layers, layer)
	}
	config, err := blob([]byte(`{"model_format":"gguf","model_family":"qwen3","model_families":["qwen3"],"model_type":"8.2B","file_type":"Q4_K_M"}`),
		"application/vnd.docker.container.image.v1+json")
	if err != nil {
		return "", err
	}
	m, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
		"config": config, "layers": layers})
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "manifests", n.Host, n.Namespace, n.Model, n.Tag)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(p, m, 0o644); err != nil {
		return "", err
	}
	return filepath.Join(dir, "blobs", "sha256-"+layers[0].Digest[len("sha256:"):]), nil
}
