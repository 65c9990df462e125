"""From judged gates to decisions: the judge, the verdicts, a partial campaign's withheld
verdicts and the diagnosis of each verdict."""
