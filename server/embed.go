package server

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/session"
)

// embeddingsRequest is the body of POST /v1/embeddings.
type embeddingsRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
	User           string          `json:"user"`
}

// parseEmbedInput reads OpenAI's input: a string, an array of strings, an
// array of token ids or an array of such arrays.
func parseEmbedInput(raw json.RawMessage) (*session.EmbedRequest, error) {
	var texts []string
	var idLists [][]int32
	// A failed Unmarshal leaves what it decoded: each form in its own value.
	var text string
	var list []string
	var ids []int32
	var lists [][]int32
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil, badRequest("input", "input is required")
	case json.Unmarshal(raw, &text) == nil:
		texts = []string{text}
	case json.Unmarshal(raw, &list) == nil:
		texts = list
	case json.Unmarshal(raw, &ids) == nil:
		idLists = [][]int32{ids}
	case json.Unmarshal(raw, &lists) == nil:
		idLists = lists
	default:
		return nil, badRequest("input", "input must be a string, an array of strings, an array of token ids or an array of such arrays")
	}
	if len(texts) == 0 && len(idLists) == 0 {
		return nil, badRequest("input", "input must not be empty")
	}
	for _, t := range texts {
		if t == "" {
			return nil, badRequest("input", "input must not hold an empty string")
		}
	}
	for _, l := range idLists {
		if len(l) == 0 {
			return nil, badRequest("input", "input must not hold an empty array of token ids")
		}
	}
	return &session.EmbedRequest{Inputs: texts, InputIDs: idLists}, nil
}

func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) error {
	var req embeddingsRequest
	if err := decodeBody(w, r, s.opts.MaxBodyBytes, &req); err != nil {
		return err
	}
	if err := s.checkModel(req.Model); err != nil {
		return err
	}
	if f := req.EncodingFormat; f != "" && f != "float" && f != "base64" {
		return badRequest("encoding_format", "encoding_format must be \"float\" or \"base64\", not %q", f)
	}
	er, err := parseEmbedInput(req.Input)
	if err != nil {
		return err
	}
	if req.Dimensions != nil {
		if *req.Dimensions < 1 {
			return badRequest("dimensions", "dimensions must be at least 1, not %d", *req.Dimensions)
		}
		er.Dimensions = *req.Dimensions
	}
	res, err := s.embed(r, er)
	if err != nil {
		return err
	}
	type datum struct {
		Object    string `json:"object"`
		Index     int    `json:"index"`
		Embedding any    `json:"embedding"`
	}
	data := make([]datum, len(res.Vectors))
	for i, v := range res.Vectors {
		data[i] = datum{Object: "embedding", Index: i, Embedding: v}
		if req.EncodingFormat == "base64" {
			// Little-endian float32s, as OpenAI sends them.
			b := make([]byte, 4*len(v))
			for j, x := range v {
				binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(x))
			}
			data[i].Embedding = base64.StdEncoding.EncodeToString(b)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data, "model": s.opts.ModelName,
		"usage": map[string]int{"prompt_tokens": res.PromptTokens, "total_tokens": res.PromptTokens}})
	return nil
}

// embed runs an embedding request under the server's time limit; an input
// over the context is the "input" field's fault.
func (s *Server) embed(r *http.Request, er *session.EmbedRequest) (*session.Embeddings, error) {
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.RequestTimeout)
	defer cancel()
	res, err := s.sess.Embed(ctx, er)
	var de *session.DimensionsError
	switch {
	case errors.As(err, &de):
		return nil, badRequest("dimensions", "%s", de)
	case errors.Is(err, engine.ErrContextOverflow):
		ae := asAPIError(err)
		param := "input"
		ae.Param = &param
		return nil, ae
	case errors.Is(err, engine.ErrNotEmbedding):
		return nil, badRequest("model", "the model %q is not an embedding model (its directory has no sentence-transformers pooling): it serves /v1/chat/completions and /v1/completions", s.opts.ModelName)
	}
	return res, err
}

// ollamaEmbedRequest is the body of POST /api/embed (input) and of the
// older POST /api/embeddings (prompt).
type ollamaEmbedRequest struct {
	Model      string          `json:"model"`
	Input      json.RawMessage `json:"input"`
	Prompt     *string         `json:"prompt"`
	Truncate   *bool           `json:"truncate"`
	Dimensions int             `json:"dimensions"`
	Options    map[string]any  `json:"options"`
	KeepAlive  json.RawMessage `json:"keep_alive"`
}

// ollamaEmbed serves /api/embed (input: a string or strings; embeddings)
// and, legacy, Ollama's older /api/embeddings (prompt: one string;
// embedding).
func (s *Server) ollamaEmbed(legacy bool) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		var req ollamaEmbedRequest
		if err := decodeBody(w, r, s.opts.MaxBodyBytes, &req); err != nil {
			return err
		}
		if err := s.checkModel(req.Model); err != nil {
			return err
		}
		var texts []string
		var one string
		var list []string
		switch {
		case legacy:
			if req.Prompt != nil && *req.Prompt != "" {
				texts = []string{*req.Prompt}
			}
		case len(req.Input) == 0 || string(req.Input) == "null":
		case json.Unmarshal(req.Input, &one) == nil:
			texts = []string{one}
		case json.Unmarshal(req.Input, &list) == nil:
			texts = list
		default:
			return badRequest("input", "input must be a string or an array of strings")
		}
		start := time.Now()
		vectors := [][]float32{}
		tokens := 0
		if len(texts) > 0 { // none: Ollama answers by loading the model
			res, err := s.embed(r, &session.EmbedRequest{Inputs: texts, Dimensions: req.Dimensions, Truncate: req.Truncate == nil || *req.Truncate})
			if err != nil {
				return err
			}
			vectors, tokens = res.Vectors, res.PromptTokens
		}
		if legacy {
			v := []float32{}
			if len(vectors) > 0 {
				v = vectors[0]
			}
			writeJSON(w, http.StatusOK, map[string]any{"embedding": v})
			return nil
		}
		writeJSON(w, http.StatusOK, map[string]any{"model": s.opts.ModelName, "embeddings": vectors,
			"total_duration": int64(time.Since(start)), "load_duration": 0, "prompt_eval_count": tokens})
		return nil
	}
}
