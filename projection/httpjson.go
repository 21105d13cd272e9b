package projection

// importErrorBody answers a failed import: the error, the line it is about
// and what was committed before it (written with httpx.WriteJSON, like every
// projection answer).
type importErrorBody struct {
	Error string `json:"error"`
	// Line is the input line the error is about, when there is one.
	Line int64 `json:"line,omitempty"`
	// Result is what the import had committed before it stopped.
	Result *ImportResult `json:"result,omitempty"`
}
