package trainer

// CkptAbandonAfter is ckptAbandonAfter, for the external tests' bounds.
const CkptAbandonAfter = ckptAbandonAfter
