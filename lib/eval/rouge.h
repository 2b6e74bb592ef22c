/* Text metrics for generation: ROUGE-L F1 and exact match.
 *
 * ROUGE-L is computed as Google's `rouge_score` package computes "rougeL" with its default
 * tokenizer (RougeScorer(["rougeL"]), no stemmer): both texts are lowercased, every run of
 * characters other than [a-z0-9] becomes a separator, and the tokens are the remaining
 * runs; LCS = longest common subsequence of the two token lists, precision = LCS / |pred|,
 * recall = LCS / |ref|, F1 = 2 P R / (P + R) (0 when P + R = 0, and 0 when either list is
 * empty, as rouge_score returns). */
#ifndef FT_ROUGE_H
#define FT_ROUGE_H

#include <stdbool.h>

#include "core/ft_error.h"

/* The F1 of ROUGE-L between a reference and a prediction (UTF-8, NUL-terminated) into
 * *f1. -1 only when out of memory. */
int ft_rouge_l(const char *reference, const char *prediction, double *f1, ft_err *err);

/* Whether a and b are equal after removing leading and trailing whitespace (Python's
 * str.strip(): Unicode White_Space). */
bool ft_exact_match(const char *a, const char *b);

#endif
