package model

import "github.com/kiln-llm/kiln/backend"

// Seq is one sequence's part of a forward step (see Model.Forward).
type Seq struct {
	Tokens []int32 // new tokens, at positions Pos, Pos+1, ...
	Pos    int     // tokens of this sequence already in the KV cache / state
	Blocks []int32 // KV block table covering Pos+len(Tokens) tokens
	Slot   int     // recurrent-state slot (hybrid models; ignored otherwise)
	Logits Logits  // which of the new positions need logits
	// Captures (hybrid models, where CapturesStates) also leave the
	// sequence's recurrent state after some of its new tokens in spare
	// slots: see backend.Capture.
	Captures []backend.Capture
	// Fed: the sequence's one new token (Tokens holds a placeholder) is
	// the one the model's last SampleStart drew for its row FedRow, taken
	// on the device (see Model.Feeds).
	Fed    bool
	FedRow int
}

// Logits selects the positions of a Seq whose logits a step returns.
type Logits uint8

const (
	NoLogits   Logits = iota // prefill chunk that is not the prompt's last
	LastLogits               // the last new position (decode, end of prompt)
	AllLogits                // every new position (validation)
)

// CacheSpec sizes the memory a model allocates for sequences: a paged KV
// cache of Blocks blocks of BlockSize tokens, and Slots recurrent-state slots
// for hybrid models.
type CacheSpec struct {
	Blocks, BlockSize, Slots int
}
