"""What several test files share: model factories, the parity oracle, state machines, checks; test files import only from here."""
