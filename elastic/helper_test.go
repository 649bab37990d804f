package elastic_test

const helperEnv = "ELASTIC_TEST_HELPER"

func helperMain(mode string) int { return 2 }
