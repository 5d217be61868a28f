package grammar

import (
	"math/big"
	"strings"
)

// Numbers are written without exponent, with at most intDigits digits
// before the point and fracDigits after it: every value a bound can name
// within them, and no endless digits from a model that would not stop.
const (
	intDigits  = 15
	fracDigits = 12
)

// Number phases.
const (
	nStart uint8 = iota
	nMinus       // after '-'
	nZero        // the integer part is 0
	nInt         // in the integer part (frame.a digits)
	nDot         // after '.'
	nFrac        // in the fraction (frame.a digits)
)

// numberByte advances a number's frame by byte c.
func numberByte(s *numberSpec, f *frame, c byte) bool {
	digit := c >= '0' && c <= '9'
	ph := f.phase
	switch {
	case ph == nStart && c == '-':
		ph = nMinus
	case (ph == nStart || ph == nMinus) && c == '0':
		ph = nZero
	case (ph == nStart || ph == nMinus) && digit:
		ph, f.a = nInt, 1
	case ph == nInt && digit && f.a < intDigits:
		f.a++
	case (ph == nZero || ph == nInt) && c == '.' && !s.integer:
		ph = nDot
	case ph == nDot && digit:
		ph, f.a = nFrac, 1
	case ph == nFrac && digit && f.a < fracDigits:
		f.a++
	default:
		return false
	}
	f.phase = ph
	if s.bounded {
		f.num += string(c)
		return s.reachable(f.num, ph)
	}
	return true
}

// numberEnds reports whether a number's frame holds a whole number within
// its bounds.
func numberEnds(s *numberSpec, f *frame) bool {
	if f.phase != nZero && f.phase != nInt && f.phase != nFrac {
		return false
	}
	if !s.bounded {
		return true
	}
	v, _ := new(big.Rat).SetString(f.num)
	return s.within(v, v)
}

// grid is the spacing of the values a number can be written as.
func (s *numberSpec) grid() *big.Rat {
	if s.integer {
		return big.NewRat(1, 1)
	}
	return new(big.Rat).SetFrac(big.NewInt(1), pow10(fracDigits))
}

func pow10(n int) *big.Int { return new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(n)), nil) }

// reachable reports whether a number written so far as prefix (in phase
// ph) can still end within the bounds. What it can become is, by
// magnitude, the grid points of a few intervals (more integer digits, then
// any fraction); the bounds are grid points too, so an interval meets them
// exactly when its ends do.
func (s *numberSpec) reachable(prefix string, ph uint8) bool {
	neg := strings.HasPrefix(prefix, "-")
	digits := strings.TrimPrefix(prefix, "-")
	g := s.grid()
	one := big.NewRat(1, 1)
	check := func(lo, hi *big.Rat) bool {
		if neg {
			lo, hi = new(big.Rat).Neg(hi), new(big.Rat).Neg(lo)
		}
		return s.within(lo, hi)
	}
	switch ph {
	case nMinus:
		return check(new(big.Rat), new(big.Rat).Sub(new(big.Rat).SetInt(pow10(intDigits)), g))
	case nZero:
		return check(new(big.Rat), new(big.Rat).Sub(one, g))
	case nInt:
		I, _ := new(big.Int).SetString(digits, 10)
		for j := 0; j <= intDigits-len(digits); j++ {
			lo := new(big.Rat).SetInt(new(big.Int).Mul(I, pow10(j)))
			hi := new(big.Rat).SetInt(new(big.Int).Mul(new(big.Int).Add(I, big.NewInt(1)), pow10(j)))
			if check(lo, hi.Sub(hi, g)) {
				return true
			}
		}
		return false
	case nDot:
		I, _ := new(big.Rat).SetString(strings.TrimSuffix(digits, "."))
		return check(I, new(big.Rat).Sub(new(big.Rat).Add(I, one), g))
	case nFrac:
		v, _ := new(big.Rat).SetString(digits)
		m := len(digits) - strings.IndexByte(digits, '.') - 1
		hi := new(big.Rat).Add(v, new(big.Rat).SetFrac(big.NewInt(1), pow10(m)))
		return check(v, hi.Sub(hi, g))
	}
	return false
}

// within reports whether [lo, hi] meets the bounds.
func (s *numberSpec) within(lo, hi *big.Rat) bool {
	return (s.lo == nil || hi.Cmp(s.lo) >= 0) && (s.hi == nil || lo.Cmp(s.hi) <= 0)
}

// setBounds sets the bounds from a schema's minimum and maximum (nil:
// none), moved inward to the grid (past the value when exclusive), and
// reports whether any number can be written within them.
func (s *numberSpec) setBounds(min, max *big.Rat, exclMin, exclMax bool) bool {
	g := s.grid()
	limit := new(big.Rat).Sub(new(big.Rat).SetInt(pow10(intDigits)), g)
	s.lo, s.hi = new(big.Rat).Neg(limit), limit
	if min != nil {
		s.lo = ratMax(s.lo, onGrid(min, g, exclMin, true))
	}
	if max != nil {
		s.hi = ratMin(s.hi, onGrid(max, g, exclMax, false))
	}
	s.bounded = min != nil || max != nil
	return s.lo.Cmp(s.hi) <= 0
}

// onGrid returns the first grid point at or above v (up; past v when
// strict), or at or below it.
func onGrid(v, g *big.Rat, strict, up bool) *big.Rat {
	q := new(big.Rat).Quo(v, g)
	n := new(big.Int).Quo(q.Num(), q.Denom()) // truncated toward zero
	exact := q.IsInt()
	switch {
	case up && (q.Sign() > 0 && !exact || exact && strict):
		n.Add(n, big.NewInt(1))
	case !up && (q.Sign() < 0 && !exact || exact && strict):
		n.Sub(n, big.NewInt(1))
	}
	return new(big.Rat).Mul(new(big.Rat).SetInt(n), g)
}

func ratMax(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) >= 0 {
		return a
	}
	return b
}

func ratMin(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) <= 0 {
		return a
	}
	return b
}

// decimal is a JSON number as sign, significant digits (no leading or
// trailing zeros; "" for zero) and exponent: ±0.digits × 10^exp. Numbers
// in schemas are compared in this form, exactly and without arithmetic on
// their exponents, which a hostile schema can make huge.
type decimal struct {
	neg    bool
	digits string
	exp    int64
}

// decimalOf reads a JSON number.
func decimalOf(s string) (decimal, bool) {
	var d decimal
	d.neg = strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, expPart, hasExp := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	if intPart == "" || !allDigits(intPart) || !allDigits(frac) {
		return d, false
	}
	var exp int64
	if hasExp {
		sign := int64(1)
		switch {
		case strings.HasPrefix(expPart, "-"):
			sign, expPart = -1, expPart[1:]
		case strings.HasPrefix(expPart, "+"):
			expPart = expPart[1:]
		}
		if expPart == "" || !allDigits(expPart) {
			return d, false
		}
		for _, c := range expPart {
			if exp < 1<<40 {
				exp = 10*exp + int64(c-'0')
			}
		}
		exp *= sign
	}
	digits := intPart + frac
	exp += int64(len(intPart))
	trimmed := strings.TrimLeft(digits, "0")
	exp -= int64(len(digits) - len(trimmed))
	d.digits = strings.TrimRight(trimmed, "0")
	d.exp = exp
	if d.digits == "" {
		d.neg, d.exp = false, 0
	}
	return d, true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// clampExp bounds the exponents ratOf builds exactly: every number
// beyond 10^clampExp in magnitude compares with the grid points of
// numbers kiln writes (multiples of 10^-fracDigits below 10^intDigits)
// as 10^clampExp does, and every nonzero one below 10^-clampExp as
// 10^-clampExp does.
const clampExp = 40

// ratOf returns a JSON number as a rational, clamped (see clampExp): exact
// for comparisons with the bounds and the numbers of the grammar, and for
// telling integers.
func ratOf(s string) (*big.Rat, bool) {
	d, ok := decimalOf(s)
	if !ok {
		return nil, false
	}
	r := new(big.Rat)
	switch {
	case d.digits == "":
		return r, true
	case d.exp > clampExp:
		r.SetInt(pow10(clampExp))
	case d.exp < -clampExp:
		r.SetFrac(big.NewInt(1), pow10(clampExp))
	default:
		m, _ := new(big.Int).SetString(d.digits, 10)
		if e := d.exp - int64(len(d.digits)); e >= 0 {
			r.SetInt(m.Mul(m, pow10(int(e))))
		} else {
			r.SetFrac(m, pow10(int(-e)))
		}
	}
	if d.neg {
		r.Neg(r)
	}
	return r, true
}
